"""The CPU kernels build, natively and for an AVX2-only x86 CPU (`TIDEGATE_CPU_MARCH=haswell`), on whatever x86
CPU runs the tests: CI machines differ (some have AVX-512 BF16 and AMX, some only AVX2), so the
paths a build for this machine does not take are built and checked here as well.

The build must hold no AVX-512 instruction (no zmm register: it would fault on an AVX2 CPU), the
AMX attention must report itself off, and the attention, elementwise and penalty kernels of that
build must pass their own tests against the torch reference (run in a fresh interpreter with the
variable set, so that library is the one loaded)."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 targets only"),
    pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None
                       and shutil.which("gcc") is None, reason="no C compiler"),
]

BUILD = r"""
from backend.kernels import cpu
path = cpu.build_library()
lib = cpu.load_library()
print(path)
print(lib.cpu_amx_mode(-1), lib.cpu_amx_mode(1))
"""


def test_the_native_build_builds(tmp_path):
    # the kernel tests skip where there is no C compiler; with one, a build that fails (a
    # compiler error in one file) must not turn into a quiet skip of all of them
    env = dict(os.environ, TIDEGATE_CACHE=str(tmp_path))
    env.pop("TIDEGATE_CPU_MARCH", None)
    code = "from backend.kernels import cpu; print(cpu.build_library())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] != "None", out.stderr[-3000:]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, TIDEGATE_CPU_MARCH="haswell", TIDEGATE_CACHE=str(tmp_path))
    env.pop("TIDEGATE_CPU_KERNELS", None)
    env.pop("TIDEGATE_CPU_AMX", None)
    return env


def test_an_avx2_build_has_no_avx512_and_no_amx(tmp_path):
    out = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    path, modes = out.stdout.strip().splitlines()[-2:]
    assert Path(path).is_relative_to(tmp_path)  # built for the variable, not the cached native
    assert modes == "0 0"  # off, and asking for it cannot turn it on
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the build's instructions")
    asm = subprocess.run(["objdump", "-d", path], capture_output=True, text=True,
                         check=True).stdout
    assert "ymm" in asm  # it is vectorized (AVX2)...
    assert "zmm" not in asm and "tmm" not in asm  # ...and holds nothing AVX-512 or AMX


def test_the_avx2_build_passes_the_kernel_tests(tmp_path):
    tests = ["tests/test_cpu_attention.py", "tests/test_cpu_ops.py", "tests/test_cpu_penalties.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *tests], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    assert list(tmp_path.rglob("tidegate_cpu-*.so"))  # the tests loaded the AVX2 build
