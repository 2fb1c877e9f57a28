"""Run a test file again in a fresh Triton-interpreter process (TRITON_INTERPRET=1) and check
what ran: the wrapper tests of tests/test_kernels_interpret.py and tests/test_gemv_interpret.py.

The exit code alone is 0 when every inner case is skipped (issue 27), so the inner run writes a
JUnit report and the wrapper asserts that cases were collected, every one ran and passed, and
none was skipped."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def run_in_interpreter(test_file: str, tmp_dir: Path, timeout_s: float = 600) -> int:
    """Run `test_file` under Triton's interpreter; returns how many cases passed (all of them)."""
    report = tmp_dir / "interpreted.xml"
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={report}", test_file], env=env, capture_output=True,
                       text=True, timeout=timeout_s, check=False)
    out = r.stdout[-8000:] + r.stderr[-2000:]
    assert r.returncode == 0, out
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "skipped", "failures", "errors")}
    assert counts["tests"] > 0 and counts["skipped"] == counts["failures"] == \
        counts["errors"] == 0, (counts, out)
    return counts["tests"]
