"""Rendering for the GPU box: shell launchers (render_template) and launch configs (render_launch).

``engine``     the jinja2 environment (lazy import, StrictUndefined, shell-quoting filters)
``templates``  run_one / run_queue / health_patrol: declared variables, validation, bash -n + shellcheck
``launch``     torchrun / accelerate / deepspeed: builders, configs, checks
``keys``       the real config keys and launcher flags of Accelerate, DeepSpeed and torchrun, with sources
``gpus``       GPUs visible here (NVML, then CUDA_VISIBLE_DEVICES) and compute capability by model
``tool``       the two ToolSpecs

Templates live in ``scripts/templates/*.j2`` so the box-side files and the tool share one source.
Nothing here imports jinja2 at module level.
"""
