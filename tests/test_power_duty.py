"""`bench.engine.power_duty` (issue 35, session 41): the limiter's answer to bursts of mixed steps. The
measurement needs CUDA step events; on the CPU the tool must refuse clearly, and its pattern parsing and
the per-pattern record (what a reader compares with the live runs) must say what they claim."""
import json

import pytest

from bench.engine import power_duty as pdu


def test_patterns_parse_and_refuse_what_is_not_a_pattern():
    assert pdu.parse_patterns("1:3, 4:4,8:0") == [(1, 3), (4, 4), (8, 0)]
    for bad in ("", "4", "0:2", "2:-1", "a:b"):
        with pytest.raises(ValueError):
            pdu.parse_patterns(bad)


def test_one_period_is_the_burst_then_the_decodes():
    assert pdu.pattern_order(3, 2) == [("m", 0), ("m", 1), ("m", 2), ("d", 0), ("d", 1)]
    assert pdu.pattern_order(1, 0) == [("m", 0)]


def test_the_record_reads_the_settled_half_by_place_in_the_burst():
    # two periods of 2:1 unsettled (slow first mixed steps), then four settled ones: the second half is read
    early = [("m", 0, 12.0), ("m", 1, 12.0), ("d", 0, 5.0)] * 2
    late = [("m", 0, 10.2), ("m", 1, 10.6), ("d", 0, 5.1)] * 4
    rows = [(0.02 * i, 1980 if i < 30 else 1860, 600.0 + i, int(i >= 30), 0) for i in range(60)]
    rec = pdu.summarize(2, 1, early + late, 10.0, 5.0, rows)
    assert rec["k"] == 2 and rec["n"] == 1 and rec["steps"] == 18
    assert rec["mixed_first_ratio"] == pytest.approx(1.02)
    assert rec["mixed_last_ratio"] == pytest.approx(1.06)
    assert rec["mixed_by_place"] == pytest.approx([1.02, 1.06])
    assert rec["decode_ratio"] == pytest.approx(1.02)
    assert rec["mixed_time_share"] == pytest.approx(20.8 / 25.9, rel=1e-6)
    nv = rec["nvml"]  # the last two thirds of the samples: 20..59
    assert nv["samples"] == 40 and nv["power_median_w"] == pytest.approx(639.5)
    assert nv["sw_power_cap_share"] == pytest.approx(0.75)
    assert pdu.summarize(1, 0, [("m", 0, 10.0)] * 4, 10.0, 5.0, None)["decode_ratio"] is None


def test_on_the_cpu_it_refuses_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "duty.json"
    rc = pdu.main(["--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8", "--device", "cpu",
                   "--out", str(out), "--mixed", "4,16,32", "--decode", "4,32"])
    assert rc == 1 and not out.exists()
    assert "CUDA" in capsys.readouterr().err


def test_a_bad_shape_is_a_usage_error(tmp_path, capsys):
    assert pdu.main(["--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "x.json"),
                     "--mixed", "4,16"]) == 2
    assert "--mixed takes 3" in capsys.readouterr().err
    json.dumps(pdu.parse_patterns(pdu.PATTERNS))  # the default parses


def test_a_pattern_runs_its_burst_then_its_decodes_two_in_flight(monkeypatch):
    import torch

    from bench.engine import profile as prof

    class Runner:  # launch / finish as the engine's runner: records what ran, in order
        device = torch.device("cpu")

        def __init__(self):
            self.launched, self.in_flight, self.most = [], 0, 0

        def launch(self, chunks):
            self.launched.append(chunks)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            return chunks

        def finish(self, step):
            self.in_flight -= 1

    ms = {"M": 10.0, "D": 5.0}
    monkeypatch.setattr(prof, "_step_device_ms", lambda runner, step: ms[step])
    r = Runner()
    steps, rows = pdu.run_pattern(r, "M", "D", 2, 1, span_s=0.02, prelude_s=0.01)
    assert r.most == 2 and rows == []  # never three in flight; no NVML on the CPU
    first_pattern_step = next(i for i, c in enumerate(r.launched) if c == "M")
    assert set(r.launched[:first_pattern_step]) == {"D"}  # the prelude: decode-only steps
    assert r.launched[first_pattern_step:first_pattern_step + 3] == ["M", "M", "D"]
    assert steps[:3] == [("m", 1, 10.0), ("d", 0, 5.0), ("m", 0, 10.0)]  # the first (from idle) left out
