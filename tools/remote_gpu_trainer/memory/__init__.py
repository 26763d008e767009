"""fsdp_memory_estimate: per-GPU training memory for DDP, FSDP and DeepSpeed ZeRO, analytic and measured.

Modules: ``architecture`` (parameter tensors from a config), ``attention_kernels`` (which SDPA kernel CUDA
runs), ``autograd_trace`` (what the Hugging Face classes' autograd saves, op by op), ``analytic`` (the
per-GPU breakdown), ``deepspeed_compat`` (DeepSpeed's own estimators), ``measured`` (a real training step
under FakeTensorMode, in a child process) with ``hf_models`` (the real Hugging Face class), ``torch_models``
(the built-in re-implementations, when transformers is missing) and ``cuda_emulation`` (CUDA's kernel,
dropout and autocast behaviour on CPU), ``advice`` (the next rung on the ladder) and ``tool`` (the
ToolSpec). Only the measurement worker imports torch and transformers, and only when a measurement runs.
"""
