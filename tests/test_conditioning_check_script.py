"""bench/results/decode_same_machine_s32/conditioning_check.sh (issue 35, session 32): the prepared device
call that checks `backend profile --decode-conditioning` against the paused replay on one card. Its CPU
form (tiny model, ~15 s) runs the whole chain, so the call cannot fail on a broken step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "results" / "decode_same_machine_s32" / "conditioning_check.sh"


def test_the_cpu_form_profiles_both_ways_replays_and_reads(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(tmp_path), "DEV": "cpu", "PY": sys.executable})
    assert out.returncode == 0, out.stdout + out.stderr
    on = json.loads((tmp_path / "profile_on.json").read_text())
    off = json.loads((tmp_path / "profile_off.json").read_text())
    assert "decode_conditioning" in on and "decode_conditioning" not in off
    rep = json.loads((tmp_path / "replay.json").read_text())
    assert [s["i"] for s in rep["steps"]] == [0, 1, 2, 3] and all(s["paused_ms"] > 0 for s in rep["steps"])
    # the reader prints each profile's decode points over the replay, and the two profiles' ratio
    assert "conditioning on" in out.stdout and "conditioning off" in out.stdout and "on / off: d1" in out.stdout
    assert out.stdout.index("profile, conditioning on") < out.stdout.index("profile, conditioning off") \
        < out.stdout.index("replay")
