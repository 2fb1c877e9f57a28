"""bench/results/decode_same_machine_s32/mixed_pass_check.py (issue 35, session 32): the prepared device
check that times mixed shapes as the profile, the paused replay, after decode steps and over fresh blocks.
Its CPU dry run (tiny model, a few seconds) runs every pass, so the call cannot fail on a broken step."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "results" / "decode_same_machine_s32" / "mixed_pass_check.py"


def test_the_cpu_dry_run_times_every_pass_at_every_shape(tmp_path):
    out_json = tmp_path / "m.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--out", str(out_json),
                          "--ds", "1,2,3", "--context", "24", "--chunk", "16"],
                         check=False, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out_json.read_text())
    shapes = {f"{d}@{s}" for d in (1, 2, 3) for s in (0, 16)}
    assert set(doc["passes"]) == {"profile_paused", "replay_paused", "after_decode", "rotated_tables"}
    for rec in doc["passes"].values():
        assert set(rec) == shapes and all(v > 0 for v in rec.values())
    for rec in doc["over_replay_paused"].values():
        assert set(rec) == shapes and all(math.isfinite(v) and v > 0 for v in rec.values())
    # the middle batch read against the line between its neighbours, both harnesses, both starts
    assert set(doc["interpolation"]) == {f"{h}@{s}" for h in ("profile_paused", "replay_paused") for s in (0, 16)}
