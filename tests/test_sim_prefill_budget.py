"""bench/simulator/prefill_budget.py (issue 11's prefill-cap study): its cost model from live step
logs recovers a known step-time law exactly (closed form), charges a step for its graph bucket,
and takes decode steps from the window it is given; the study runs end to end."""
import gzip
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = [16, 32, 64, 128, 256, 320, 384, 512]


def _study():
    from bench.simulator import prefill_budget

    return prefill_budget


def _bucket_ms(b: int) -> float:  # a weight-bound floor, then compute-bound
    return max(18.0, 0.1 * b)


def _law(d: int, chunks) -> float:
    n = d + sum(p for p, _ in chunks)
    b = min(x for x in BUCKETS if x >= n)
    return _bucket_ms(b) + 0.05 * d + 1e-4 * sum(p * p for p, _ in chunks) + 2e-5 * sum(
        p * s for p, s in chunks)


def _write_log(path: Path) -> None:
    rows = []
    t = 1000.0
    shapes = [(d, [(p, s)]) for d in (0, 3, 10, 25) for p, s in ((13, 0), (40, 0), (100, 64),
                                                                  (200, 0), (230, 256), (400, 0))]
    shapes += [(5, [(100, 0), (60, 0)]), (2, [(150, 0), (150, 100)]), (20, [(8, 0), (30, 0)])]
    for d, chunks in shapes:
        if d + sum(p for p, _ in chunks) > max(BUCKETS):
            continue
        rows.append({"t": t, "ms": 0.0, "device_ms": _law(d, chunks), "decodes": d,
                     "prefill_tokens": sum(p for p, _ in chunks), "prefill_chunks": len(chunks),
                     "prefill": [["r", p, s] for p, s in chunks]})
        t += 1.0
    for d, ms in ((1, 16.0), (8, 17.0), (32, 20.0)):  # decode-only steps, early ...
        rows.append({"t": t, "ms": ms, "device_ms": ms, "decodes": d, "prefill_tokens": 0,
                     "prefill_chunks": 0, "prefill": []})
        t += 1.0
    rows.append({"t": 5000.0, "ms": 40.0, "device_ms": 40.0, "decodes": 32, "prefill_tokens": 0,
                 "prefill_chunks": 0, "prefill": []})  # ... and one late, slower (power cap)
    with gzip.open(path, "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))


def test_step_log_cost_recovers_a_known_law(tmp_path):
    study = _study()
    _write_log(tmp_path / "steps.jsonl.gz")
    cost = study.StepLogCost([str(tmp_path / "steps.jsonl.gz")], BUCKETS, num_blocks=100)
    assert cost.r2 == pytest.approx(1.0, abs=1e-9)
    for d, chunks in ((0, [(13, 0)]), (25, [(230, 256)]), (5, [(100, 0), (60, 0)])):
        assert cost.step_time(d, sum(p for p, _ in chunks), 0,
                              prefill_chunks=chunks) * 1e3 == pytest.approx(_law(d, chunks), rel=1e-6)
    # 281 tokens run as bucket 320, unseen in the log: its term lies between 256's and 384's
    assert cost.step_time(25, 256, 0) * 1e3 == pytest.approx(
        (_bucket_ms(256) + _bucket_ms(384)) / 2 + 0.05 * 25 + 1e-4 * 256 ** 2, rel=1e-6)
    assert cost.num_kv_blocks(16) == 100


def test_decode_steps_come_from_the_window(tmp_path):
    study = _study()
    _write_log(tmp_path / "steps.jsonl.gz")
    cost = study.StepLogCost([str(tmp_path / "steps.jsonl.gz")], BUCKETS)
    assert cost.step_time(32, 0, 0) * 1e3 == pytest.approx(30.0)  # median of 20 and 40
    assert cost.step_time(4, 0, 0) * 1e3 == pytest.approx(16.0 + 3 / 7)  # between batch 1 and 8
    cost.decode_window((0.0, 4000.0))
    assert cost.step_time(32, 0, 0) * 1e3 == pytest.approx(20.0)
    cost.decode_window((4000.0, 6000.0))
    assert cost.step_time(1, 0, 0) * 1e3 == pytest.approx(40.0)  # only batch 32 there: flat


def test_the_study_runs_and_the_cap_lowers_itl_p99(tmp_path, capsys):
    """The committed logs, one seed, 512/128 at 8 req/s: the cap at least halves ITL p99, and
    every request completes."""
    study = _study()
    out = tmp_path / "s.json"
    assert study.main(["--seeds", "0", "--workloads", "long_8rps", "--configs",
                       "default= cap256=cap:256", "--json", str(out)]) == 0
    rows = {r["config"]: r["mean"] for r in json.loads(out.read_text())["rows"]}
    assert rows["cap256"]["itl_p99"] < 0.5 * rows["default"]["itl_p99"]
    assert rows["cap256"]["completed"] == rows["default"]["completed"] == 200
    assert "| cap256 | long_8rps |" in capsys.readouterr().out


def test_config_specs_name_every_knob_and_refuse_unknown_ones():
    study = _study()
    name, kw = study.parse_config("big=mns:400,mnbt:4096,cap:256,seqs:2")
    assert name == "big" and kw["max_num_seqs"] == 400 and kw["max_num_batched_tokens"] == 4096
    assert kw["prefill_cap"].max_tokens == 256 and kw["prefill_cap"].backlog_seqs == 2
    assert study.parse_config("default=") == ("default", {})
    with pytest.raises(SystemExit, match="unknown key"):
        study.parse_config("x=seq:3")
