"""DeepSpeed's own model-states estimators, reproduced to the byte (no deepspeed import).

Transcribed from ``deepspeed/runtime/zero/stage_1_and_2.py::estimate_zero2_model_states_mem_needs``
(the version after PR #5099: 2Ψ + 18Ψ/G without offload; older docs print 4Ψ + 16Ψ/G) and
``deepspeed/runtime/zero/stage3.py::estimate_zero3_model_states_mem_needs``. Ψ is the total parameter
count with shared parameters counted once, G = nodes × GPUs per node, and DeepSpeed multiplies host
memory by ``additional_buffer_factor`` = 1.5 "to be conservative". These cover parameters, gradients
and optimizer states of mixed-precision Adam only: no activations, buffers, CUDA context or NCCL.
DeepSpeed prints GiB labelled "GB"; the rows here carry bytes and the same text DeepSpeed prints.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DSRow:
    cpu_bytes: int
    gpu_bytes: int
    options: str
    offload_optimizer: bool
    offload_param: bool = False
    zero_init: bool | None = None

    def printed(self) -> str:
        """The line DeepSpeed prints under ``  per CPU  |  per GPU |   Options``."""
        return f" {self.cpu_bytes / 2**30:7.2f}GB | {self.gpu_bytes / 2**30:6.2f}GB | {self.options}"


def zero2_model_states(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                       cpu_offload: bool = True, additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) exactly as ``estimate_zero2_model_states_mem_needs`` returns them."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 2 = params_16bit; 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3_model_states(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                       num_nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                       zero_init: bool = True, additional_buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_memory) exactly as ``estimate_zero3_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params  # 2-byte params gathered + 2-byte grads computed
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def zero2_table(total_params: int, num_gpus_per_node: int, num_nodes: int) -> list[DSRow]:
    """The rows ``estimate_zero2_model_states_mem_needs_all_cold`` prints, in its order."""
    rows = []
    for offload in (True, False):
        cpu, gpu = zero2_model_states(total_params, num_gpus_per_node, num_nodes, cpu_offload=offload)
        rows.append(DSRow(cpu, gpu, f"offload_optimizer={'cpu ' if offload else 'none'}", offload))
    return rows


def zero3_table(total_params: int, largest_layer_params: int, num_gpus_per_node: int, num_nodes: int) -> list[DSRow]:
    """The rows ``estimate_zero3_model_states_mem_needs_all_cold`` prints, in its order."""
    rows = []
    for offload_opt in (True, False):
        for offload_param in (True, False):
            if not offload_opt and offload_param:
                continue
            for zero_init in (True, False):
                cpu, gpu, _ = zero3_model_states(total_params, largest_layer_params, num_gpus_per_node, num_nodes,
                                                 offload_opt, offload_param, zero_init)
                options = (f"offload_param={'cpu ' if offload_param else 'none'}, "
                           f"offload_optimizer={'cpu ' if offload_opt else 'none'}, zero_init={int(zero_init)}")
                rows.append(DSRow(cpu, gpu, options, offload_opt, offload_param, zero_init))
    return rows


def header(total_params: int, num_gpus_per_node: int, num_nodes: int, largest_layer_params: int | None) -> str:
    """DeepSpeed's heading lines (``int(total_params/1e6)``M, truncated, as it prints them)."""
    nodes = "nodes" if num_nodes > 1 else "node"
    gpus = "GPUs" if num_gpus_per_node > 1 else "GPU"
    model = f"SW: Model with {int(total_params / 1e6)}M total params"
    model += f", {int(largest_layer_params / 1e6)}M largest layer params." if largest_layer_params is not None else "."
    return (f"Estimated memory needed for params, optim states and gradients for a:\n"
            f"HW: Setup with {num_nodes} {nodes}, {num_gpus_per_node} {gpus} per node.\n{model}\n"
            "  per CPU  |  per GPU |   Options")
