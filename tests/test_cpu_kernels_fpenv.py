"""Loading the CPU kernels must not change the process's floating-point state.

A shared library linked with -ffast-math turns on flush-to-zero for the whole process when it
loads: every later float op (the sampler, numpy, hypothesis' own checks) then loses subnormals.
Run in a fresh interpreter so nothing loaded earlier in the test session hides it.
"""
import subprocess
import sys

import pytest

CHECK = r"""
import numpy as np
from backend.kernels import cpu as cpu_kernels
lib = cpu_kernels.load_library()
if lib is None:
    print("SKIP")
    raise SystemExit(0)
tiny = np.array([1e-40], dtype=np.float32)     # a float32 subnormal
print("OK" if (tiny * np.float32(1.0))[0] != 0 else "FTZ")
"""


def test_loading_cpu_kernels_keeps_subnormals():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    result = out.stdout.strip().splitlines()[-1]
    if result == "SKIP":
        pytest.skip("no C compiler: the CPU kernels are not built")
    assert result == "OK", "loading the CPU kernels turned on flush-to-zero"
