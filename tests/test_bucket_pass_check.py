"""bench/results/decode_same_machine_s32/bucket_pass_check.py (issue 35, session 32): the device
call that times the profile's decode-bucket pass against the other harnesses' ways of timing the
same decode shapes. Its CPU form (tiny model, wall ms, a few seconds) runs every pass, so the call
cannot fail on a broken step."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "results" / "decode_same_machine_s32" / "bucket_pass_check.py"
PASSES = ("bucket_order", "single_c", "after_mixed", "rotated_tables", "replay_paused",
          "bucket_order_2")
DS = (2, 3, 4)


def test_the_cpu_dry_run_times_every_pass_at_every_batch(tmp_path):
    out_path = tmp_path / "bpc.json"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--out", str(out_path),
         "--ds", ",".join(map(str, DS)), "--contexts", "32,48,64"],
        check=False, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out_path.read_text())
    assert doc["device_name"] == "cpu" and doc["context"] == 48 and doc["ds"] == list(DS)
    assert set(doc["passes"]) == set(PASSES)
    for name in PASSES:
        rec = doc["passes"][name]
        assert set(rec) == {str(d) for d in DS}, name
        assert all(r["ms"] > 0 and math.isfinite(r["ms"]) for r in rec.values()), name
        assert f"{name} " in out.stdout
    # the bucket passes time every context, the reported one the middle
    for name in ("bucket_order", "bucket_order_2"):
        for r in doc["passes"][name].values():
            assert set(r["by_context"]) == {"32", "48", "64"} and r["ms"] == r["by_context"]["48"]
    ratios = doc["over_replay_paused"]
    assert set(ratios) == set(PASSES) - {"replay_paused"}
    for name, per_d in ratios.items():
        assert set(per_d) == {str(d) for d in DS}, name
        assert all(math.isfinite(x) and x > 0 for x in per_d.values()), name
