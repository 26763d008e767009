"""fsdp_memory_estimate: per-GPU training memory for DDP, FSDP and DeepSpeed ZeRO, analytic and measured.

Modules: ``architecture`` (parameter tensors from a config), ``autograd_trace`` (what autograd saves),
``analytic`` (the per-GPU breakdown), ``deepspeed_compat`` (DeepSpeed's own estimators),
``torch_models`` and ``measured`` (a real training step under FakeTensorMode, in a child process),
``advice`` (the next rung on the ladder) and ``tool`` (the ToolSpec). Only ``torch_models`` and the
measurement worker import torch, and only when a measurement runs.
"""
