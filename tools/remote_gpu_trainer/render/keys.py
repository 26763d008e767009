"""The configuration keys and launcher flags that Accelerate, DeepSpeed and torchrun really accept.

Rendered configs are checked against these sets, and so are the keys a caller adds through
``extra_config``: a misspelt key is the dangerous kind of mistake, because none of the three tools
rejects it. Accelerate copies every nested key onto its argument namespace (a typo does nothing),
and DeepSpeed reads the top level with ``dict.get`` (a typo does nothing either); only DeepSpeed's
``zero_optimization`` section is a pydantic model that forbids unknown keys.

Where each set comes from (read in the released sources, not in docs):

* Accelerate 1.15.0 (PyPI wheel): top-level keys = the fields of ``ClusterConfig`` and ``BaseConfig`` in
  ``accelerate/commands/config/config_args.py`` (its YAML loader raises on any other key); keys
  inside ``fsdp_config`` / ``deepspeed_config`` = the flags of the "FSDP Arguments" / "DeepSpeed
  Arguments" groups in ``accelerate/commands/launch.py`` (``_validate_launch_command`` copies them
  onto those flags); ``distributed_type`` values from ``utils/dataclasses.py::DistributedType``.
* DeepSpeed 0.19.8 (PyPI sdist): top-level keys = those ``DeepSpeedConfig`` reads from the dict
  (recorded by passing it a dict that logs every lookup), plus the sections other modules read
  (optimizer, scheduler, activation_checkpointing, aio, autotuning, flops_profiler), minus the keys
  0.19.8 removed and now rejects (``DEEPSPEED_REMOVED_KEYS``); ``zero_optimization`` keys = the
  fields and aliases of ``DeepSpeedZeroConfig`` (``runtime/zero/config.py``); ``offload_*`` keys from
  ``runtime/zero/offload_config.py``; ``fp16``/``bf16`` keys from ``runtime/precision_config.py``;
  the batch rule from ``DeepSpeedConfig._batch_assertion``; launcher flags from
  ``launcher/runner.py::parse_args``.
* torchrun: ``torch/distributed/run.py::get_args_parser`` of torch 2.13.0. A test parses every
  rendered torchrun command with the installed torch's own parser, so a flag torch drops fails CI.

The sets are held to the real packages by tests/test_render_accelerate_real.py (accelerate is in the
dev extra, so CI runs it) and tests/test_render_deepspeed_real.py (DeepSpeed has no wheel; run it by
hand where DeepSpeed is installed).
"""

from __future__ import annotations

ACCELERATE_VERSION = "1.15.0"
DEEPSPEED_VERSION = "0.19.8"
TORCH_VERSION = "2.13.0"

ACCELERATE_TOP_KEYS = frozenset({
    # BaseConfig
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    # ClusterConfig
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port",
    "rdzv_backend", "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config",
    "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config",
    "downcast_bf16", "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands",
    "tpu_vm", "tpu_env", "dynamo_config",
})
ACCELERATE_DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")
"""The values this tool renders (Accelerate knows more: MULTI_CPU, XLA, MEGATRON_LM, MULTI_NPU, ...)."""
ACCELERATE_MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
ACCELERATE_FSDP_KEYS = frozenset({
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
})
ACCELERATE_DEEPSPEED_KEYS = frozenset({
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names",
})
ACCELERATE_NESTED = {"FSDP": ("fsdp_config", ACCELERATE_FSDP_KEYS),
                     "DEEPSPEED": ("deepspeed_config", ACCELERATE_DEEPSPEED_KEYS)}
ACCELERATE_LAUNCH_FLAGS = frozenset({
    "--config_file", "--quiet", "--cpu", "--multi_gpu", "--tpu", "--mixed_precision", "--num_processes",
    "--num_machines", "--num_cpu_threads_per_process", "--enable_cpu_affinity", "--dynamo_backend",
    "--use_deepspeed", "--use_fsdp", "--gpu_ids", "--same_network", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--tee", "--log_dir", "--role", "--rdzv_backend", "--rdzv_conf", "--max_restarts",
    "--monitor_interval", "--module", "--no_python", "--debug",
}) | {f"--{k}" for k in ACCELERATE_FSDP_KEYS | ACCELERATE_DEEPSPEED_KEYS}

DEEPSPEED_TOP_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print",
    "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "torch_autocast", "gradient_clipping",
    "zero_optimization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "wall_clock_breakdown",
    "memory_breakdown", "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op",
    "communication_data_type", "seq_parallel_communication_data_type", "dump_state", "activation_checkpointing",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "checkpoint", "datastates_ckpt", "data_types",
    "aio", "data_efficiency", "autotuning", "pipeline", "disable_allgather", "dataloader_drop_last", "comms_logger",
    "hybrid_engine", "compile", "tensor_parallel", "expert_parallel", "use_data_before_expert_parallelism",
    "weight_quantization", "timers", "log_level", "vocabulary_size", "disable_python_gc",
    "managed_gradient_accumulation",
})
DEEPSPEED_REMOVED_KEYS = {
    # DeepSpeed 0.19.8 raises DeepSpeedConfigError at start-up when any of these is present
    # (runtime/config.py::_REMOVED_TOP_LEVEL_CONFIG_KEYS, deepspeedai/DeepSpeed#8489).
    "amp": "Apex AMP support is gone: use \"fp16\", \"bf16\" or \"torch_autocast\"",
    "sparse_gradients": "gone: gradients of nn.Embedding(sparse=True) are still reduced sparsely without it",
    "elasticity": "elastic training is gone: set the batch sizes directly",
    "curriculum_learning": "moved under data_efficiency.data_sampling.curriculum_learning",
    "nebula": "Nebula checkpointing is gone", "compression_training": "the compression library is gone",
    "quantize_training": "MoQ is gone", "eigenvalue": "MoQ is gone", "sparse_attention": "gone",
    "graph_harvesting": "gone", "progressive_layer_drop": "gone",
}
DEEPSPEED_ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size", "param_persistence_threshold",
    "model_persistence_threshold", "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "module_granularity_threshold", "use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
    # pydantic aliases of the fields above
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
})
DEEPSPEED_OFFLOAD_PARAM_KEYS = frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                                          "pin_memory"})
DEEPSPEED_OFFLOAD_OPTIMIZER_KEYS = frozenset({"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                                              "pipeline_write", "fast_init", "ratio", "super_offload",
                                              "cpuadam_cores_perc"})
DEEPSPEED_FP16_KEYS = frozenset({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                                 "hysteresis", "consecutive_hysteresis", "min_loss_scale",
                                 "fp16_master_weights_and_grads"})
DEEPSPEED_BF16_KEYS = frozenset({"enabled", "immediate_grad_update", "check_grad_overflow",
                                 "bf16_master_weights_and_grads", "bf16_optimizer_states"})
DEEPSPEED_NESTED = {
    "zero_optimization": DEEPSPEED_ZERO_KEYS,
    "zero_optimization.offload_param": DEEPSPEED_OFFLOAD_PARAM_KEYS,
    "zero_optimization.offload_optimizer": DEEPSPEED_OFFLOAD_OPTIMIZER_KEYS,
    "fp16": DEEPSPEED_FP16_KEYS,
    "bf16": DEEPSPEED_BF16_KEYS,
}
DEEPSPEED_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DEEPSPEED_LAUNCH_FLAGS = frozenset({
    "--hostfile", "--include", "--exclude", "--num_nodes", "--num_gpus", "--num_accelerators", "--master_port",
    "--master_addr", "--quiet",
    "--node_rank", "--launcher", "--launcher_args", "--module", "--no_python", "--no_local_rank", "--no_ssh",
    "--no_ssh_check", "--force_multi", "--save_pid", "--enable_each_rank_log", "--autotuning",
    "--bind_cores_to_rank", "--bind_core_list", "--ssh_port", "--venv_script", "--log_level",
})

TORCHRUN_FLAGS = frozenset({
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--standalone",
    "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role", "--module",
    "--no-python", "--run-path", "--log-dir", "--redirects", "--tee", "--local-ranks-filter",
    "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--node-rank", "--master-addr", "--master-port",
    "--local-addr", "--logs-specs", "--numa-binding", "--signals-to-handle", "--shutdown-timeout",
    "--virtual-local-rank",
})
"""torch 2.13's long flags, dashed spelling (each also has an underscore alias)."""


def unknown_keys(mapping: dict, allowed: frozenset[str]) -> list[str]:
    return sorted(k for k in mapping if k not in allowed)
