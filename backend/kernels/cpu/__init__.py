"""C kernels for the CPU engine, built at first use for the CPU they run on.

Every `*.c` file here is compiled together with the host's C compiler (`-O3 -march=native`, so
the loops vectorize to whatever the CPU has: AVX2, AVX-512, NEON; AMX tiles for the bf16
attention's scores where the CPU has them, paged_attention_amx.c) into one shared library in a
cache directory keyed by the sources, the flags and the CPU model; a later start loads it in
milliseconds. No compiler, a failed build, or `TIDEGATE_CPU_KERNELS=off`: `load_library()`
returns None and the callers keep the torch reference.

Functions are called through ctypes with raw data pointers; callers check dtype, device and
layout before calling (fp32 or bf16, CPU, unit stride in the last dimension).
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

log = logging.getLogger("tidegate.backend")

SOURCES = sorted(Path(__file__).parent.glob("*.c"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))  # in the cache key, not on the command line
# Not -ffast-math: linking a shared library with it pulls in crtfastmath.o, whose constructor
# turns on flush-to-zero/denormals-are-zero for the whole process when the library loads —
# every later float op of the backend (and numpy, and hypothesis) would then lose subnormals.
# These are the parts of -ffast-math the loops need to vectorize (reassociated reductions,
# fused multiply-add, no errno/traps), without touching the process's floating-point state.
CFLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
          "-fno-signed-zeros", "-freciprocal-math", "-ffinite-math-only", "-ffp-contract=fast",
          "-fPIC", "-shared", "-std=c11")
# x86: full-width AVX-512 where the CPU has it (gcc defaults to 256-bit vectors on recent Intel
# cores; the paged attention decode at B=200 ran 2.85 -> 2.3 ms a layer with 512); a no-op on AVX2
if platform.machine() in ("x86_64", "AMD64"):
    CFLAGS += ("-mprefer-vector-width=512",)



def _cflags() -> tuple[str, ...]:
    """The compile flags: `-march=native` unless `TIDEGATE_CPU_MARCH` names another target
    (e.g. `haswell`: an AVX2-only build, without the AVX-512 and AMX paths, which runs on any
    later x86 CPU too; tests/test_cpu_kernels_avx2.py builds and checks it on this machine)."""
    return ("-march=" + (os.environ.get("TIDEGATE_CPU_MARCH") or "native"), *CFLAGS)


P, I, L, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
SIGNATURES = {
    "paged_attention_f32": [P, L, P, P, P, I, P, P, I, I, I, I, I, F, P],
    "paged_attention_bf16": [P, L, P, P, P, I, P, P, I, I, I, I, I, F, P],
    "write_kv_rows": [P, L, P, L, P, I, L, P, P],
    "rms_norm_f32": [P, L, P, I, I, F, P],
    "add_rms_norm_f32": [P, P, P, I, I, F, P, P],
    "rotary_f32": [P, L, I, P, L, I, P, P, I, I],
    "silu_and_mul_f32": [P, I, I, P],
    "rms_norm_bf16": [P, L, P, I, I, F, P],
    "add_rms_norm_bf16": [P, P, P, I, I, F, P, P],
    "rotary_bf16": [P, L, I, P, L, I, P, P, I, I],
    "silu_and_mul_bf16": [P, I, I, P],
    "apply_penalties_f32": [P, I, I, L, P, P, P, P, P, P, P],
    "cpu_amx_mode": [I],
    "paged_attention_bf16_amx": [P, L, P, P, P, I, P, P, I, I, I, I, I, F, P],
}
RETURNS_INT = ("paged_attention_f32", "paged_attention_bf16", "rms_norm_bf16", "add_rms_norm_bf16",
               "apply_penalties_f32", "cpu_amx_mode", "paged_attention_bf16_amx")
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_arithmetic(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 natively (`avx512_bf16` or `amx_bf16` in its flags): a
    bf16 checkpoint then runs in bf16 by default (`backend.model.loader.resolve_dtype`). Without
    them (AVX2) bf16 matmuls are 2-6x slower than fp32, with them 3-8x faster at 32+ rows
    (BENCHMARKS.md, issue 32)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cache_dir() -> Path:
    root = os.environ.get("TIDEGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tidegate")
    return Path(root) / "cpu_kernels"


def build_library() -> Path | None:
    """Compile the kernels (once per sources/flags/CPU); the .so path, or None."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    flags = _cflags()
    h = hashlib.sha256(" ".join(flags).encode() + _cpu_model().encode())
    for src in (*SOURCES, *HEADERS):
        h.update(src.read_bytes())
    name = f"tidegate_cpu-{h.hexdigest()[:16]}.so"
    # the user's cache, else the temp dir (a read-only home must not stop the engine)
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"tidegate-{os.getuid()}"):
        out = folder / name
        if out.exists():
            return out
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # compile to a private name, then rename: concurrent starts never load a half file
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        except OSError:
            continue
        os.close(fd)
        try:
            subprocess.run([cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], check=True,
                           capture_output=True, timeout=300)
            os.replace(tmp, out)
            return out
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("CPU kernels did not build (%s); using the torch reference", exc)
            Path(tmp).unlink(missing_ok=True)
            return None
    return None


def load_library() -> ctypes.CDLL | None:
    global _lib
    if _lib is False:
        _lib = None
        if os.environ.get("TIDEGATE_CPU_KERNELS", "") != "off":
            path = build_library()
            try:
                lib = ctypes.CDLL(str(path)) if path is not None else None
            except OSError as exc:  # e.g. a noexec temp dir
                log.warning("CPU kernels did not load (%s); using the torch reference", exc)
                lib = None
            if lib is not None:
                for name, argtypes in SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int if name in RETURNS_INT else None
                _lib = lib
    return _lib
