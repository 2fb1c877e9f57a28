"""scheduler/ is pure policy: importing it (every module, present and future) loads no event loop,
no torch, no sockets."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("torch", "asyncio", "zmq", "socket", "aiohttp", "uvloop")
SCHEDULER = Path(__file__).resolve().parent.parent / "scheduler"


def test_scheduler_modules_import_nothing_forbidden():
    modules = ["scheduler"] + sorted(
        f"scheduler.{p.stem}" for p in SCHEDULER.glob("*.py") if p.stem != "__init__")
    assert "scheduler.batcher" in modules and "scheduler.queues" in modules
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=SCHEDULER.parent, capture_output=True, check=False,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
