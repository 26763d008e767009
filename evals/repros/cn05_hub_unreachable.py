"""CN-05 on any machine without a route to huggingface.co (or with HF_ENDPOINT pointing at a dead
host): what the installed huggingface_hub prints when the Hub is unreachable and the cache is empty.

    python evals/repros/cn05_hub_unreachable.py            # library call, as transformers makes it
    python evals/repros/cn05_hub_unreachable.py cli        # the `hf download` console script

Uses a throw-away HF_HOME so a warm cache cannot hide the failure; set HF_ENDPOINT=http://127.0.0.1:9
to force the failure on a machine that does reach the Hub.
"""

import os
import shutil
import subprocess
import sys
import tempfile

if __name__ == "__main__":
    home = tempfile.mkdtemp(prefix="hf-empty-")
    env = {**os.environ, "HF_HOME": home, "HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}
    if sys.argv[1:] == ["cli"]:
        hf = shutil.which("hf") or os.path.join(os.path.dirname(sys.executable), "hf")
        argv = [hf, "download", "google-bert/bert-base-uncased", "config.json"]
    else:
        argv = [sys.executable, "-c", "import huggingface_hub as h; print(h.__version__, flush=True); "
                "h.hf_hub_download('google-bert/bert-base-uncased', 'config.json')"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    shutil.rmtree(home, ignore_errors=True)
    print("\n".join(ln for ln in (done.stdout + done.stderr).splitlines() if ln and not ln.startswith(" ")))
    print(f"exit status {done.returncode}")
