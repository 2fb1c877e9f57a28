"""bench/results/conditioned_s33/mixed_spread_check.py (issue 35, session 33): the CPU dry run times every
composition (equal, uniform, shuffled, one-long contexts) beside a chunk and alone, and reads each over its equal
twin; the contexts are what the module says."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench/results/conditioned_s33/mixed_spread_check.py"


def test_contexts_of_each_kind():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from mixed_spread_check import contexts
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert contexts("equal", 4, 512, 640) == [576] * 4
    ramp = contexts("uniform", 5, 512, 640)
    assert ramp == [512, 544, 576, 608, 640] and sum(ramp) / 5 == 576
    shuffled = contexts("shuffled", 5, 512, 640)
    assert sorted(shuffled) == ramp and shuffled != ramp
    assert contexts("one_long", 4, 512, 640) == [512, 512, 512, 2048]
    assert contexts("edges", 4, 512, 640) == [512, 576, 640, 512]
    assert contexts("off_edge", 3, 512, 640) == [577] * 3


def test_the_cpu_dry_run_times_every_composition(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--out", str(out),
                        "--ds", "2,3", "--lo", "16", "--hi", "24", "--chunk", "16"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["timed_on_device"] is False and doc["ds"] == [2, 3]
    keys = {(row["d"], row["kind"], row["mixed"]) for row in doc["rows"]}
    assert keys == {(d, k, m) for d in (2, 3) for k in ("equal", "uniform", "shuffled", "one_long", "edges", "off_edge")
                    for m in (True, False)}
    for row in doc["rows"]:
        assert row["ms"] > 0
        if row["kind"] == "equal":
            assert row["over_equal"] == 1.0
    assert "mixed (chunk at 0)" in r.stdout and "decode-only" in r.stdout
