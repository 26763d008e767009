"""GPU health pre-flight (``gpu_health``) and stale VRAM holders (``reap_vram_zombies``).

``backend``  the interface between checks and NVML (GpuSnapshot, Unread), the pynvml adapter and the
             backend that runs it in the NVML worker process (``nvml_session``)
``checks``   one pure function per check: snapshot → Check(verdict, observed, threshold, explanation, entry)
``xid``      XIDs of this boot from /dev/kmsg or journalctl, and what each means
``holders``  who holds VRAM: active/orphan/zombie/D-state/namespaced/phantom/invalid, /dev/nvidia* scan
``probe``    reads every GPU through the backend under a deadline, optional counter window, then judges
``zombies``  the reaper: chooses candidates, hands them to processes.safekill
``fakes``    named fake machines (NVML, processes, kernel log) for tests and demos
``tool``     the two ToolSpecs and their text rendering

Nothing is imported here; pynvml is imported only when a real backend makes its first call.
"""
