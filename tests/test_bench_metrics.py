"""sims.metrics for the live client (bench): hand-computed values, and the same report as the
simulator's for the same timings."""
from __future__ import annotations

import numpy as np
import pytest

from sims.metrics import RequestRecord, class_of, summarize


def rec(i, send, chunks, max_tokens=None, usage=None, error=None, prompt_len=10):
    times = [t for t, _ in chunks]
    counts = [k for _, k in chunks]
    out = usage if usage is not None else sum(counts)
    return RequestRecord(i, prompt_len, max_tokens if max_tokens is not None else out, send,
                         times, counts, out, error)


def hand_records():
    return [
        rec(0, 0.0, [(0.10, 1), (0.15, 1), (0.25, 1)]),            # fast, 3 tokens
        rec(1, 1.0, [(1.20, 1)]),                                   # fast, 1 token: no TPOT
        rec(2, 2.0, [(2.05, 1), (2.45, 3)], max_tokens=40),         # normal; a 3-token chunk
        rec(3, 2.1, [], max_tokens=100, error="http_503"),          # slow, failed
    ]


def approx_stats(d, mean, p50, p90, p99):
    assert d == pytest.approx({"mean": mean, "p50": p50, "p90": p90, "p99": p99}, rel=1e-9)


def test_hand_computed_summary():
    s = summarize(hand_records(), start_time=0.0, slo_ttft_ms=150, slo_tpot_ms=100)
    assert s["duration_s"] == pytest.approx(2.45)
    assert s["num_requests"] == 4 and s["completed"] == 3 and s["num_errors"] == 1
    assert s["errors"] == {"http_503": 1}
    assert s["request_throughput"] == pytest.approx(3 / 2.45)
    assert s["output_throughput"] == pytest.approx(8 / 2.45)
    assert s["total_output_tokens"] == 8 and s["total_input_tokens"] == 30
    assert s["total_token_throughput"] == pytest.approx(38 / 2.45)
    assert s["num_output_mismatch"] == 1                       # request 2 asked 40, got 4
    # TTFT [100, 200, 50] ms; sorted [50, 100, 200]; p90 at position 1.8
    approx_stats(s["ttft_ms"], 350 / 3, 100, 180, 198)
    # TPOT: 150/2 = 75 and 400/3; the 1-token request is left out
    approx_stats(s["tpot_ms"], (75 + 400 / 3) / 2, (75 + 400 / 3) / 2,
                 75 + 0.9 * (400 / 3 - 75), 75 + 0.99 * (400 / 3 - 75))
    # ITL: one gap per token-carrying chunk: [50, 100] and [400]
    approx_stats(s["itl_ms"], 550 / 3, 100, 340, 394)
    # E2EL [250, 200, 450]
    approx_stats(s["e2el_ms"], 300, 250, 410, 446)
    # request 0 meets both SLOs; 1 misses TTFT (200 > 150); 2 misses TPOT (133 > 100); 3 failed
    assert s["num_good"] == 1
    assert s["goodput_fraction"] == pytest.approx(1 / 3)       # of the completed requests
    assert s["goodput"] == pytest.approx(1 / 2.45)
    assert s["slo"] == {"ttft_ms": 150, "tpot_ms": 100}
    assert set(s["by_class"]) == {"fast", "normal", "slow"}
    fast = s["by_class"]["fast"]
    assert fast["num_requests"] == 2 and fast["completed"] == 2
    approx_stats(fast["ttft_ms"], 150, 150, 190, 199)
    assert fast["request_throughput"] == pytest.approx(2 / 2.45)
    slow = s["by_class"]["slow"]
    assert slow["num_errors"] == 1 and slow["completed"] == 0
    assert slow["ttft_ms"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_no_slo_means_every_completed_request_is_good():
    s = summarize(hand_records(), start_time=0.0)
    assert s["num_good"] == 3 and s["goodput_fraction"] == 1.0
    assert s["goodput"] == s["request_throughput"]


def test_usage_overrides_chunk_count_for_tpot():
    # Server said 5 completion tokens though only 2 token-carrying chunks were seen.
    s = summarize([rec(0, 0.0, [(0.1, 1), (0.5, 1)], usage=5)], start_time=0.0)
    assert s["total_output_tokens"] == 5
    assert s["tpot_ms"]["mean"] == pytest.approx(100.0)
    assert s["itl_ms"]["mean"] == pytest.approx(400.0)


def test_start_time_defaults_to_first_send_and_all_failed_is_zero():
    rs = [rec(0, 5.0, [(5.5, 1)]), rec(1, 6.0, [(7.0, 1)])]
    assert summarize(rs)["duration_s"] == pytest.approx(2.0)
    failed = [rec(0, 1.0, [], max_tokens=4, error="timeout"), rec(1, 1.0, [], max_tokens=4)]
    s = summarize(failed)
    assert s["duration_s"] == 0.0 and s["request_throughput"] == 0.0
    assert s["errors"] == {"timeout": 1, "no_tokens": 1}
    assert s["num_good"] == 0 and s["goodput"] == 0.0 and s["goodput_fraction"] == 0.0


def test_class_bounds_match_the_scheduler():
    from scheduler.classes import QueueClass, classify
    names = {QueueClass.FAST: "fast", QueueClass.NORMAL: "normal", QueueClass.SLOW: "slow"}
    for n in range(1, 300):
        assert class_of(n) == names[classify(n)]


def synthetic(n=400, seed=7):
    rng = np.random.default_rng(seed)
    records = []
    send = np.sort(rng.uniform(0, 30, n))
    for i in range(n):
        num_chunks = int(rng.integers(1, 40))
        tokens = rng.integers(1, 4, num_chunks).tolist() if i % 3 == 0 else [1] * num_chunks
        gaps = rng.exponential(0.02, num_chunks)
        gaps[0] += rng.exponential(0.3)
        times = (send[i] + np.cumsum(gaps)).tolist()
        records.append(RequestRecord(i, int(rng.integers(1, 600)), int(sum(tokens)), float(send[i]),
                                     times, tokens, int(sum(tokens)),
                                     "http_429" if i % 17 == 5 else None))
    return records


def sim_result_from(records):
    """The same timings as the simulator's raw outcome (a failed request: rejected, NaN times)."""
    se = pytest.importorskip("sims.event_loop")
    from scheduler.classes import classify
    from sims.workload import Workload

    n = len(records)
    ok = np.array([r.ok for r in records])
    nan = np.full(n, np.nan)
    first = np.where(ok, [r.chunk_times[0] if r.ok else 0.0 for r in records], nan)
    finish = np.where(ok, [r.chunk_times[-1] if r.ok else 0.0 for r in records], nan)
    itl = np.concatenate([np.diff(r.chunk_times) for r in records if r.ok])
    wl = Workload(np.array([r.send_time for r in records]),
                  np.array([r.prompt_len for r in records]),
                  np.array([r.max_tokens for r in records]), np.full(n, -1), np.zeros(n, int),
                  np.full(n, -1, np.int8), np.zeros(n, np.int32))
    empty = np.zeros(0)
    return se.SimResult(
        workload=wl, dispatch_time=np.array([r.send_time for r in records]),
        first_token_time=first, finish_time=finish,
        num_output=np.array([r.output_tokens for r in records]),
        queue_class=np.array([int(classify(r.max_tokens)) for r in records]),
        rejected=~ok, itl_values=itl, itl_weights=np.ones(len(itl)), batch_sizes=empty,
        step_decode=empty, step_prefill=empty, step_time=empty,
        series={k: empty for k in ("t", "queue_depth", "kv_usage", "running", "fragmentation")},
        backend_stats=[{"num_prefix_query_tokens": 0, "num_prefix_hit_tokens": 0,
                        "num_preemptions": 0}], events=1, wall_s=1.0, sim_end=0.0)


@pytest.mark.parametrize("slo", [(None, None), (400.0, 30.0), (250.0, None)])
def test_identical_to_the_simulators_report(slo):
    sr = pytest.importorskip("sims.report")
    records = synthetic(seed=3)
    ours = summarize(records, start_time=records[0].send_time, slo_ttft_ms=slo[0],
                     slo_tpot_ms=slo[1])
    theirs = sr.summarize(sim_result_from(records), slo_ttft_ms=slo[0], slo_tpot_ms=slo[1])
    for key in ("completed", "duration_s", "request_throughput", "output_throughput",
                "total_token_throughput", "ttft_ms", "tpot_ms", "e2el_ms", "goodput",
                "goodput_fraction", "slo"):
        assert ours[key] == theirs[key], key
    # the simulator pools ITL as a weighted sample: same numbers up to summation order
    assert ours["itl_ms"] == pytest.approx(theirs["itl_ms"], rel=1e-12)
    assert set(ours["by_class"]) == set(theirs["by_class"])
    for name, c in theirs["by_class"].items():
        for key in ("completed", "ttft_ms", "tpot_ms", "e2el_ms", "goodput_fraction"):
            assert ours["by_class"][name][key] == c[key], (name, key)
