"""scripts/gpu_decode_same_machine.sh (issue 35, session 31): the prepared device call that measures
the live decode steps, their profile and their replays over a zeroed and a filled pool on one machine.
Its CPU form (tiny model, ~25 s) runs the whole chain, so the call cannot fail on a broken step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_decode_same_machine.sh"


def test_the_cpu_form_runs_the_part_the_compositions_and_three_replays_in_order(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(tmp_path), "PART": "cpu", "PY": sys.executable})
    assert out.returncode == 0, out.stdout + out.stderr
    comps = json.loads((tmp_path / "compositions.json").read_text())
    assert comps["steps"] and all("live_device_ms" in s and "ctxs" in s for s in comps["steps"])
    # the steps form one contiguous window of the live log (the pipelined pass replays the live order)
    idx = [s["i"] for s in comps["steps"]]
    assert idx == list(range(idx[0], idx[0] + len(idx)))
    fills = {}
    for v in ("zeros", "fill", "zeros2"):
        rep = json.loads((tmp_path / f"replay_{v}.json").read_text())
        assert len(rep["steps"]) == len(comps["steps"])
        fills[v] = rep["fill_kv"]
        # only the first replay is also timed paused (as the profile times its points)
        assert all(("paused_ms" in s) == (v == "zeros") for s in rep["steps"])
        assert f"== {v}" in out.stdout
    assert fills == {"zeros": False, "fill": True, "zeros2": False}  # A B A: a drift shows as zeros != zeros2
    assert out.stdout.index("replay zeros") < out.stdout.index("replay fill") < out.stdout.index("replay zeros2")


def test_out_is_required():
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    out = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=30,
                         env={**env, "PART": "cpu"})
    assert out.returncode != 0 and "OUT" in out.stderr
