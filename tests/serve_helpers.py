"""`tidegate serve` as a subprocess for the end-to-end tests: started once per module, ready
when it prints its "serving model NAME on URL" line, stopped with SIGTERM (which must exit 0)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
READY = re.compile(r"serving model (\S+) on (http://\S+)")


def start_serve(*args: str, timeout_s: float = 180.0) -> tuple[subprocess.Popen, str, str]:
    """`tidegate serve --port 0 --log-level warning ARGS`: (process, model name, base URL) once
    it serves; the test fails (and the process is killed) when it does not start."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0",
         "--log-level", "warning", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving model" in line or not line:
            break
    m = READY.search(line)
    if not m:
        proc.kill()
        proc.wait()
        pytest.fail(f"gateway did not start: {line!r}")
    return proc, m.group(1), m.group(2)


@contextmanager
def serving(*args: str, timeout_s: float = 180.0) -> Iterator[dict]:
    """A module fixture's body: yields {"url", "model"}; SIGTERM after, and exit code 0."""
    proc, model, url = start_serve(*args, timeout_s=timeout_s)
    try:
        yield {"url": url, "model": model}
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
