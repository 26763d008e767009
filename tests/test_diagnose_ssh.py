"""diagnose_error on the exact texts of remote failures: what OpenSSH 9.2 prints and what the tools print.

Each text was captured by running the real `ssh` and `rgt --host` against a private sshd on 127.0.0.1
(refused, timed out, wrong key, unknown and changed host keys, a shell-only endpoint, a missing or other
runtime, no python, a full disk, a failing tool, a timeout) or in a private network namespace (DNS).
The raw ssh line goes to the general entry (SSH-05/06/08) where one exists; the tools' wording, which
embeds ssh's line, goes to the entry about the remote tools (SSH-14..26).
"""

from __future__ import annotations

import pytest

from remote_gpu_trainer.diagnose import diagnose

CHANGED_BANNER = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:mNWa8wgehKx+ox6+EWxndKXpQP4X2LwZgbHBXfssuF4.
Please contact your system administrator.
Add correct host key in /tmp/sshrepro/fleet/kh-changed to get rid of this message.
Offending ED25519 key in /tmp/sshrepro/fleet/kh-changed:1
  remove with:
  ssh-keygen -f "/tmp/sshrepro/fleet/kh-changed" -R "[127.0.0.1]:43625"
Host key for [127.0.0.1]:43625 has changed and you have requested strict checking.
Host key verification failed."""

#: What OpenSSH 9.2 prints on stderr (exit 255), verbatim.
RAW = {
    "dns": ("ssh: Could not resolve hostname no-such-host.invalid: Name or service not known", "SSH-14"),
    "dns-offline": ("ssh: Could not resolve hostname no-such-host.invalid: Temporary failure in name resolution",
                    "SSH-14"),
    "refused": ("ssh: connect to host 127.0.0.1 port 44817: Connection refused", "SSH-08"),
    "timeout": ("ssh: connect to host 127.0.0.1 port 39797: Connection timed out", "SSH-08"),
    "denied": ("root@127.0.0.1: Permission denied (publickey).", "SSH-06"),
    "unknown-key": ("No ED25519 host key is known for [127.0.0.1]:43625 and you have requested strict checking.\n"
                    "Host key verification failed.", "SSH-18"),
    "changed-key": (CHANGED_BANNER, "SSH-05"),
}

#: What `rgt <command> --host box-x` printed on stderr (exit 5), verbatim.
TOOL = {
    "dns": ("rgt ports: host box-nxdomain: ssh could not resolve the host name; ssh said: ssh: Could not resolve "
            "hostname no-such-host.invalid: Name or service not known. Next: check the spelling, or add a Host entry "
            "with HostName to ~/.ssh/config (see the provider profile's SSH section for the address to use)",
            "SSH-14"),
    "refused": ("rgt ports: host box-closed: nothing accepts ssh connections on that port; ssh said: ssh: connect to "
                "host 127.0.0.1 port 44817: Connection refused. Next: check the port (rented boxes often use a "
                "custom one), and that the box is running (a stopped pod refuses connections); the provider's "
                "console shows the current SSH command", "SSH-15"),
    "timeout": ("rgt ports: host box-drop: the connection timed out; ssh said: ssh: connect to host 127.0.0.1 port "
                "39797: Connection timed out. Next: the box may be stopped, preempted or behind a firewall; check it "
                "in the provider's console, then retry", "SSH-16"),
    "no-answer": ("rgt ports: host box-x: the box did not answer within 30 s. Next: check that the box is up "
                  "(`ssh box-x true` in a terminal); a proxy that only offers an interactive shell never answers a "
                  "command", "SSH-16"),
    "denied": ("rgt ports: host box-stranger: the box refused authentication (no usable key; passwords cannot be "
               "typed by an agent); ssh said: root@127.0.0.1: Permission denied (publickey).. Next: add your public "
               "key to the box (the provider's console or ~/.ssh/authorized_keys), check IdentityFile in "
               "~/.ssh/config, or load the key into ssh-agent; `ssh -v box-stranger true` shows which keys were "
               "offered", "SSH-17"),
    "unknown-key": ("rgt ports: host box-unknown: the box's host key is not known and your ssh config refuses new "
                    "keys; ssh said: No ED25519 host key is known for [127.0.0.1]:43625 and you have requested strict "
                    "checking. Next: your config has StrictHostKeyChecking yes for this host, so ssh never records a "
                    "new key itself: `ssh-keyscan -p 43625 127.0.0.1 > new-box.key`, check that `ssh-keygen -lf "
                    "new-box.key` lists the fingerprint the provider's console or the box's own terminal shows (there: "
                    "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then `cat new-box.key >> "
                    "/tmp/sshrepro/fleet/kh-empty`; or set `StrictHostKeyChecking accept-new` in its Host block (new "
                    "keys recorded, changed keys still refused)", "SSH-18"),
    "changed-key": ("rgt ports: host box-changed: the box's host key changed since it was recorded in known_hosts (the "
                    "box now presents the ED25519 key SHA256:mNWa8wgehKx+ox6+EWxndKXpQP4X2LwZgbHBXfssuF4); ssh said: "
                    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @. Next: if the provider re-used the "
                    "address for a new box (common after re-renting), remove the old key with `ssh-keygen -f "
                    "/tmp/sshrepro/fleet/kh-changed -R '[127.0.0.1]:43625'` and retry (the new key is then recorded on "
                    "first use, accept-new); otherwise do not connect", "SSH-19"),
    "changed-key-strict": (
        "rgt ports: host box-changed: the box's host key changed since it was recorded in known_hosts (the box now "
        "presents the ED25519 key SHA256:mNWa8wgehKx+ox6+EWxndKXpQP4X2LwZgbHBXfssuF4); ssh said: @    WARNING: REMOTE "
        "HOST IDENTIFICATION HAS CHANGED!     @. Next: if the provider re-used the address for a new box (common after "
        "re-renting), remove the old key with `ssh-keygen -f /tmp/sshrepro/fleet/kh-changed -R '[127.0.0.1]:43625'`; "
        "your config has StrictHostKeyChecking yes, so record the new key yourself: `ssh-keyscan -p 43625 127.0.0.1 > "
        "new-box.key`, check that `ssh-keygen -lf new-box.key` lists "
        "SHA256:mNWa8wgehKx+ox6+EWxndKXpQP4X2LwZgbHBXfssuF4 (the key ssh was shown) and that the provider's console "
        "or the box's own terminal shows the same (there: "
        "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then `cat new-box.key >> "
        "/tmp/sshrepro/fleet/kh-changed`; then retry. Otherwise do not connect", "SSH-19"),
    "shell-only": ("rgt ports: host box-shell: this ssh endpoint did not run our command (it printed: 'Error: this "
                   "endpoint needs an interactive terminal (PTY)'). Next: use an ssh endpoint that runs commands "
                   "(e.g. the box's own sshd on its direct TCP port), not a proxy that only opens an interactive "
                   "shell", "SSH-20"),
    "no-python": ("rgt box install: host box-nopy: the box has no python 3.11 or newer (Python 3.8.10). Next: install "
                  "python 3.11+ on the box (e.g. `apt install python3.11 python3.11-venv`, or conda/uv), then run "
                  "`rgt box install box-nopy` again", "SSH-21"),
    "missing": ("rgt ports: host box-bare: the box has no remote-gpu-trainer runtime. Next: run `rgt box install "
                "box-bare` once (a venv under ~/.cache/remote-gpu-trainer, no root; it uses the box's own torch), or "
                "over MCP call box_install(hosts=[\"box-bare\"]); several boxes: all in one call", "SSH-22"),
    "mismatch": ("rgt ports: host box-bare: the box has runtime 0.0.1+0123456789ab, this checkout needs "
                 "0.1.0+c3ba737f77e2. Next: run `rgt box install box-bare` (installs 0.1.0+c3ba737f77e2 beside the "
                 "old one; `rgt box remove box-bare` clears old versions)", "SSH-23"),
    "mismatch-status": ("box-bare: has 0.0.1+0123456789ab, needs 0.1.0+c3ba737f77e2\n"
                        "installed: 0.0.1+0123456789ab (ready)\n"
                        "next: run `rgt box install box-bare` to add 0.1.0+c3ba737f77e2", "SSH-23"),
    "disk-full": ("rgt box install: host box-full: the box ran out of disk space during the install. Next: free "
                  "space in the home directory (`df -h ~` on the box), then run `rgt box install box-full` again",
                  "SSH-24"),
    "disk-full-tar": ("rgt box install: host box-full: the install failed at step upload: tar: "
                      "remote_gpu_trainer-0.1.0+a97d3218f4fb-py3-none-any.whl: Wrote only 512 of 10240 bytes. Next: "
                      "read the detail; with no package index on the box, use `rgt box install box-full --wheels`",
                      "SSH-24"),
    "disk-full-pip": ("rgt box install: host box-full: the install failed at step pip: rgt-fail: pip. Next: read the "
                      "detail; with no package index on the box, use `rgt box install box-full --wheels`", "SSH-24"),
    "tool-failed": ("rgt health: host box-ok: gpu_health failed on the box: RuntimeError: simulated failure inside "
                    "the tool. Next: read the detail (the tail of its traceback); run the same tool with the same "
                    "arguments on the box (`rgt` in the runtime's venv) to reproduce", "SSH-25"),
    "runtime-ended": ("rgt health: host box-ok: the box's runtime ended (exit -9): no output. Next: run `rgt box "
                      "status box-ok`; reinstall with `rgt box install box-ok` if it is damaged", "SSH-25"),
    "timeout-box": ("rgt repro: host box-ok: repro_scaler_bug: the tool overran its 1.0 s deadline on the box. Next: "
                    "its processes on the box were ended; retry, or raise RGT_REMOTE_TIMEOUT", "SSH-26"),
    "timeout-local": ("rgt repro: host box-ok: repro_scaler_bug did not finish within 600 s. Next: the call was "
                      "stopped and its processes on the box ended; retry, or raise RGT_REMOTE_TIMEOUT for slow checks",
                      "SSH-26"),
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_openssh_message_ranks_its_entry_first(name):
    text, expected = RAW[name]
    ranked = [m.id for m in diagnose(text, 5).matches]
    assert ranked and ranked[0] == expected, f"{name}: expected {expected} first, got {ranked}"


@pytest.mark.parametrize("name", sorted(TOOL))
def test_tool_message_ranks_its_entry_first(name):
    text, expected = TOOL[name]
    ranked = [m.id for m in diagnose(text, 5).matches]
    assert ranked and ranked[0] == expected, f"{name}: expected {expected} first, got {ranked}"


@pytest.mark.parametrize("name", sorted(TOOL))
def test_mcp_form_of_the_tool_message_ranks_the_same(name):
    """Over MCP the error text is `host …: … Next: … [kind]`, without the `rgt <command>: ` prefix."""
    text, expected = TOOL[name]
    mcp = text.split(": ", 1)[1] if text.startswith("rgt ") else text
    ranked = [m.id for m in diagnose(mcp + " [some_kind]", 5).matches]
    assert ranked and ranked[0] == expected, f"{name}: expected {expected} first, got {ranked}"
