"""Attention for the CPU engine: a paged kernel in C behind the model's attention seam.

`CpuAttention` has `TorchAttention`'s call signature. It writes K/V into their pages like the
reference, then runs `cpu_kernels/paged_attention.c` once per layer for every sequence of the
step (decodes and prefill chunks alike): K/V are read in place from the pages, so nothing is
gathered, padded or upcast per step, and there is no Python loop over sequences. The reference
(`backend.attention`) stays the oracle and the fallback for what the kernel does not take
(non-fp32 pools, quantized pools, no C compiler).

The kernel is compiled at first use with the host's C compiler for this CPU (`-march=native`)
into a cache directory keyed by the source, the flags and the CPU model, so a later start
loads it in milliseconds. Set `TIDEGATE_CPU_KERNELS=off` to use the reference.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from backend.attention import TorchAttention, write_kv
from backend.context import ForwardContext

log = logging.getLogger("tidegate.backend")

SOURCE = Path(__file__).with_name("cpu_kernels") / "paged_attention.c"
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fno-math-errno", "-fPIC", "-shared", "-std=c11")
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get("TIDEGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tidegate")
    return Path(root) / "cpu_kernels"


def build_library() -> Path | None:
    """Compile the kernel (once per source/flags/CPU); the .so path, or None without a compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join(CFLAGS).encode() + _cpu_model().encode()).hexdigest()[:16]
    out = _cache_dir() / f"paged_attention-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # compile to a private name, then rename: concurrent starts never load a half-written file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(tmp, out)
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("CPU attention kernel did not build (%s); using the torch reference", exc)
        Path(tmp).unlink(missing_ok=True)
        return None
    return out


def load_library() -> ctypes.CDLL | None:
    global _lib
    if _lib is False:
        _lib = None
        if os.environ.get("TIDEGATE_CPU_KERNELS", "") != "off":
            path = build_library()
            if path is not None:
                lib = ctypes.CDLL(str(path))
                fn = lib.paged_attention_f32
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 2 + \
                    [ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_void_p]
                _lib = lib
    return _lib


class CpuAttention(TorchAttention):
    """`TorchAttention` with the step's attention in one C call per layer (fp32 pools)."""

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        lib = load_library()
        self._kernel = lib.paged_attention_f32 if lib is not None else None

    @property
    def uses_kernel(self) -> bool:
        return self._kernel is not None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if (self._kernel is None or not isinstance(k_cache, torch.Tensor)
                or k_cache.dtype != torch.float32 or q.dtype != torch.float32
                or k_cache.device.type != "cpu"):
            return super().__call__(q, k, v, k_cache, v_cache, ctx)
        write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
        q = q.contiguous()
        num_tokens, num_heads, head_dim = q.shape
        out = torch.empty_like(q)
        n = ctx.num_tokens
        if n < num_tokens:
            out[n:].zero_()  # padding rows, as the reference
        tables = ctx.block_tables
        if tables.stride(1) != 1:
            tables = tables.contiguous()
        qsl = ctx.query_start_loc
        lens = ctx.context_lens
        rc = self._kernel(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            tables.stride(0), qsl.data_ptr(), lens.data_ptr(), ctx.num_seqs, num_heads,
            k_cache.shape[2], head_dim, k_cache.shape[1], self.scale, out.data_ptr())
        if rc != 0:
            raise ValueError(f"CPU attention kernel refused the shapes (code {rc})")
        return out
