"""Shared helpers for the Triton kernels: is Triton usable here, and device facts.

Every kernel module pairs a Triton kernel with a torch reference (the oracle) and a thin
dispatcher: Triton when the tensor lives on CUDA and Triton imports, else the reference.
`TIDEGATE_KERNELS=torch` forces the reference everywhere (for A/B checks on the GPU).
`TRITON_INTERPRET=1` lets the Triton path run on CPU tensors through Triton's interpreter
(debugging only; slow).

Programmatic dependent launch (PDL, sm_90+): every kernel here can be launched with
`launch_pdl=True` and then starts with `pdl_enter(USE_PDL)`: `griddepcontrol.wait` (wait for the
previous kernel in the stream to finish and its writes to be visible) and
`griddepcontrol.launch_dependents` (let the next kernel's launch start now). Its launch and
ramp-up then overlap this kernel's tail instead of following it, inside CUDA graphs too. Every
PDL kernel waits before touching memory, so ordering stays transitive along the stream.
On by default on sm_90+; `TIDEGATE_PDL=0` (or `set_pdl(False)` before capturing) turns it off.
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

try:  # grid dependency control (Triton >= 3.3)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_wait = gdc_launch_dependents = None
    HAS_GDC = False

# On: measured on the H200 (33B, batch-1 decode graphs, 2026-12-02): bf16 with our GEMV 19.05
# -> 16.88 ms/token, fp8 11.26 -> 10.65 ms (engine_bench --ab); graphs with PDL equal plain
# launches bit for bit (tests/test_kernels_gpu.py::test_pdl_chain_in_a_graph_equals_plain_launches).
PDL_DEFAULT = True
_PDL = {"enabled": os.environ.get("TIDEGATE_PDL", "1" if PDL_DEFAULT else "0") == "1"}


def set_pdl(enabled: bool) -> None:
    """Launch the kernels with programmatic dependent launch from now on (or not); graphs
    captured earlier keep what they were captured with."""
    _PDL["enabled"] = bool(enabled)


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def use_pdl(t: torch.Tensor) -> bool:
    """True where a kernel on `t` should be launched with PDL (CUDA sm_90+, compiled Triton)."""
    if not (_PDL["enabled"] and HAS_GDC and t.is_cuda) or triton_interpreting():
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _capability(index) >= (9, 0)


def pdl_args(t: torch.Tensor) -> dict:
    """Launch keywords of a kernel that takes `USE_PDL: tl.constexpr` and starts with
    `pdl_enter(USE_PDL)`."""
    return {"USE_PDL": True, "launch_pdl": True} if use_pdl(t) else {"USE_PDL": False}


if HAS_TRITON:

    @triton.jit
    def pdl_enter(USE_PDL: tl.constexpr):
        if USE_PDL:
            gdc_wait()
            gdc_launch_dependents()


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
