"""Shared helpers for the Triton kernels: is Triton usable here, and device facts.

Every kernel module pairs a Triton kernel with a torch reference (the oracle) and a thin
dispatcher: Triton when the tensor lives on CUDA and Triton imports, else the reference.
`TIDEGATE_KERNELS=torch` forces the reference everywhere (for A/B checks on the GPU).
`TRITON_INTERPRET=1` lets the Triton path run on CPU tensors through Triton's interpreter
(debugging only; slow).
"""
from __future__ import annotations

import functools
import os

import torch

try:  # Triton is an optional (gpu) dependency; the CPU path never needs it.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(t: torch.Tensor) -> bool:
    """True when the Triton kernel should serve this tensor."""
    if not HAS_TRITON or os.environ.get("TIDEGATE_KERNELS", "") == "torch":
        return False
    return t.is_cuda or triton_interpreting()


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (132 on the H200); 132 for a CPU tensor (interpreter)."""
    if device.type != "cuda":
        return 132
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms(index)
