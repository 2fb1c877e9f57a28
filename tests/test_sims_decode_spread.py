"""Issue 35, session 19: decode-only steps whose sequences have unequal contexts (sims.decode_spread).

The launch model against closed forms (processor sharing of the bandwidth, a per-program cap), the
kappa read back from spread points made with a known kappa, the spread points kept out of the fit,
and the simulator charging a spread batch more than an even one of the same total context."""
import itertools
import json
import math

import numpy as np
import pytest

from sims.decode_spread import (
    DecodeLaunchPlan,
    expand_context_lens,
    launch_time,
    program_works,
    solve_kappa,
    spread_factor,
)
from sims.profile_cost import ProfileCost

BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]
PLAN = DecodeLaunchPlan.legacy(32, BUCKETS, 16384)   # the 6.7B's launches (32 kv heads)


def test_the_legacy_plan_fills_one_wave_of_528_programs():
    # 132 SMs x 4: a bucket of b sequences x 32 heads takes 528 // (32 b) splits
    assert PLAN.launch(1) == (1, 16, 528)
    assert PLAN.launch(3) == (4, 4, 528)
    assert PLAN.launch(8) == (8, 2, 528)
    assert PLAN.launch(9) == (16, 1, 528)
    assert PLAN.launch(100) == (128, 1, 528)


def test_program_works_cut_every_context_into_its_splits_in_launch_order():
    w = program_works([1000, 70, 300], 4, 2, 3, 64).reshape(3, 2, 4)   # [split, head, seq]
    assert w.sum(axis=0)[0].tolist() == [1000, 70, 300, 1]   # the padding row reads one token
    assert (w[:, 0] == w[:, 1]).all()                         # every head alike
    # ceil(ceil(1000 / 3) / 64) tiles of 64 = 384 tokens a split, the last one the rest
    assert w[:, 0, 0].tolist() == [384, 384, 232]


def test_an_even_full_wave_takes_its_total_work():
    works = np.full(512, 700.0)
    assert launch_time(works, 528, 2.0) == pytest.approx(512 * 700.0)
    # two full waves, evenly: still the bandwidth's time
    assert launch_time(np.full(1056, 700.0), 528, 2.0) == pytest.approx(1056 * 700.0)


def test_one_long_program_runs_its_tail_at_the_cap():
    # all share until the short ones end, then the long one alone at kappa / R
    n, s, big, r, kappa = 512, 500.0, 2000.0, 528, 2.5
    works = np.array([s] * (n - 1) + [big])
    assert launch_time(works, r, kappa) == pytest.approx(n * s + (big - s) / (kappa / r))
    # no cap (kappa large enough that a lone program may take the whole bandwidth): total work
    assert launch_time(works, r, float(r)) == pytest.approx(works.sum())


def test_the_several_wave_path_agrees_with_the_one_wave_closed_form_at_the_boundary():
    rng = np.random.default_rng(1)
    works = rng.integers(100, 3000, 528).astype(float)
    one = launch_time(works, 528, 2.0)
    # the same works with one more tiny program: the heap path, and barely longer
    more = launch_time(np.append(works, 1.0), 528, 2.0)
    assert one <= more <= one * 1.001


def test_the_spread_factor_is_one_for_equal_contexts_and_falls_with_kappa():
    assert spread_factor([600] * 16, PLAN, 2.0) == pytest.approx(1.0)
    ctx = [512] * 15 + [2048]
    f = [spread_factor(ctx, PLAN, k) for k in (1.5, 2.0, 3.0, 6.0)]
    assert all(a > b for a, b in itertools.pairwise(f))
    assert f[0] > 1.5 and f[-1] > 1.0
    assert spread_factor(ctx, PLAN, math.inf) == 1.0


@pytest.mark.parametrize("kappa", [1.7, 2.5, 4.0])
def test_solve_kappa_reads_back_the_kappa_that_made_the_factor(kappa):
    ctx = [512] * 7 + [2048]
    assert solve_kappa(ctx, PLAN, spread_factor(ctx, PLAN, kappa)) == pytest.approx(kappa, rel=1e-3)
    assert solve_kappa(ctx, PLAN, 1.0) == math.inf   # no excess seen: no cap


def _decode_s(d, c):
    return 4e-3 + 3e-5 * d + 2e-7 * d * c


def _profile_doc(kappa=None):
    """A synthetic CUDA profile of the 6.7B shape: decode points at even contexts and, with
    `kappa`, one-long spread points timed by this module's own model at that kappa."""
    pts = []
    for c in (512, 1024, 2048):
        for d in (1, 2, 4, 8, 16, 32, 64):
            pts.append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": c,
                        "num_context_tokens": d * c, "step_ms": 1e3 * _decode_s(d, c)})
    for p in (128, 256, 512):
        pts.append({"num_decode_seqs": 0, "num_prefill_tokens": p, "context_len": 0,
                    "num_context_tokens": p, "step_ms": 1e3 * (6e-3 + 2e-5 * p)})
    doc = {"format": "tidegate-profile/1", "model": "deepseek-coder-6.7b", "device": "cuda", "num_kv_blocks": 20000,
           "block_size": 16,
           "max_model_len": 16384, "cuda_graph_decode_buckets": BUCKETS, "points": pts}
    if kappa is not None:
        plan = {str(b): {"splits": s, "resident_programs": r}
                for b, s, r in zip(PLAN.buckets, PLAN.splits, PLAN.resident)}
        doc["decode_attention"] = {"kernel": "triton", "num_kv_heads": 32, "sm_count": 132, "block_n": 64,
                                   "split_context_len": 16384, "buckets": plan}
        for d in (4, 8, 16, 32):
            ctxs = [512] * (d - 1) + [2048]
            total = sum(ctxs)
            # the even model's time at the multiple of its total context the launch model gives
            k = kappa(d) if callable(kappa) else kappa
            t = _decode_s(d, total * spread_factor(ctxs, PLAN, k) / d)
            pts.append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": round(total / d),
                        "num_context_tokens": total, "step_ms": 1e3 * t,
                        "decode_context_lens": [[d - 1, 512], [1, 2048]], "decode_spread": "one_long"})
    return doc


def _write(tmp_path, doc, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_spread_points_beside_a_chunk_change_neither_the_fit_nor_kappa(tmp_path):
    """The mixed spread points (session 20: a spread point's decodes beside one prefill chunk) are
    the mixed steps' own term's (session 21, tests/test_sims_mixed_spread.py): kept out of the fit,
    the residuals and the decode-only kappa."""
    doc = _profile_doc(2.5)
    base = ProfileCost.from_json(_write(tmp_path, doc, "a.json"), ctx_quantum=1)
    for d in (4, 16):
        doc["points"].append({"num_decode_seqs": d, "num_prefill_tokens": 256, "num_prefill_seqs": 1,
                              "prefill_context_len": 0, "context_len": round(((d - 1) * 512 + 2048) / d),
                              "num_context_tokens": (d - 1) * 512 + 2048 + 256, "step_ms": 99.0,
                              "decode_context_lens": [[d - 1, 512], [1, 2048]], "decode_spread": "one_long"})
    cost = ProfileCost.from_json(_write(tmp_path, doc, "b.json"), ctx_quantum=1)
    assert [p["num_decode_seqs"] for p in cost.mixed_spread_points] == [4, 16]
    assert np.array_equal(cost.coef, base.coef) and len(cost.points) == len(base.points)
    assert cost.spread_point_kappas == base.spread_point_kappas
    for shape in ((8, 0, 8 * 700), (16, 256, 16 * 700 + 256)):
        assert cost.step_time(*shape) == base.step_time(*shape)
    assert base.mixed_spread_points == []


def test_the_profile_reads_kappa_back_from_its_spread_points(tmp_path):
    cost = ProfileCost.from_json(_write(tmp_path, _profile_doc(2.5)), ctx_quantum=1)
    assert cost.charges_decode_spread
    assert cost.spread_kappa == pytest.approx(2.5, rel=0.02)
    assert len(cost.spread_point_kappas) == 4
    assert cost.describe()["decode_spread"]["kappa"] == pytest.approx(2.5, rel=0.02)


def test_spread_points_stay_out_of_the_fit(tmp_path):
    with_spread = ProfileCost.from_json(_write(tmp_path, _profile_doc(2.5), "a.json"), ctx_quantum=1)
    without = ProfileCost.from_json(_write(tmp_path, _profile_doc(None), "b.json"), ctx_quantum=1)
    assert np.allclose(with_spread.coef, without.coef)
    assert len(with_spread.points) == len(without.points)
    assert not without.charges_decode_spread and "decode_spread" not in without.describe()
    for d, c in ((8, 700), (16, 900), (40, 1500)):
        assert with_spread.step_time(d, 0, d * c) == without.step_time(d, 0, d * c)


def test_a_spread_batch_costs_more_than_an_even_one_and_off_turns_it_off(tmp_path):
    path = _write(tmp_path, _profile_doc(2.5))
    cost = ProfileCost.from_json(path, ctx_quantum=1)
    even = [704] * 16
    spread = [512] * 15 + [3584]
    assert sum(even) == sum(spread)
    assert cost.decode_context_multiple(even) == pytest.approx(1.0)
    m = cost.decode_context_multiple(spread)
    assert m > 1.3
    # what the step is charged: its total context times the multiple
    assert cost.step_time(16, 0, int(sum(spread) * m)) > cost.step_time(16, 0, sum(even)) * 1.1
    off = ProfileCost.from_json(path, ctx_quantum=1, decode_spread="off")
    assert not off.charges_decode_spread and off.decode_context_multiple(spread) == 1.0
    # a what-if kappa on a profile without spread points (the legacy plan from the model's shape)
    whatif = ProfileCost.from_json(_write(tmp_path, _profile_doc(None), "c.json"), ctx_quantum=1,
                                   decode_spread=2.5)
    assert whatif.decode_context_multiple(spread) == pytest.approx(m, rel=1e-6)


def test_expand_context_lens():
    assert expand_context_lens([[2, 512], [1, 2048]]) == [512, 512, 2048]


def test_the_simulator_charges_a_spread_workload_more(tmp_path):
    """End to end: the same requests through the event loop, with the term (a what-if kappa)
    and without; mixed prompt lengths make the decode batches uneven, so decode steps lengthen
    and TPOT rises; equal prompts (every batch even up to the outputs' few tokens) barely move."""
    from sims.runner import CostSpec, RunSpec, run_spec
    from sims.workload import LengthSpec, WorkloadConfig
    path = _write(tmp_path, _profile_doc(None))

    def tpot(spread, input_len):
        spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(path), decode_spread=spread),
                       workload=WorkloadConfig(num_requests=80, rate=40.0, input_len=LengthSpec.parse(input_len),
                                               output_len=LengthSpec.parse(48), seed=3))
        rep = run_spec(spec)
        return rep["tpot_ms"]["p50"]

    mixed = "lognormal:512:0.9"
    assert tpot(2.0, mixed) > tpot("off", mixed) * 1.03
    assert tpot(2.0, "512") == pytest.approx(tpot("off", "512"), rel=0.02)


def test_a_profile_whose_attention_is_not_the_triton_kernel_gets_no_term(tmp_path):
    doc = _profile_doc(2.5)
    doc["decode_attention"]["kernel"] = "cpu"   # the CPU's attention: not the launch modelled here
    cost = ProfileCost.from_json(_write(tmp_path, doc), ctx_quantum=1)
    assert not cost.charges_decode_spread
    assert cost.decode_context_multiple([512] * 15 + [3584]) == 1.0


def test_each_batch_takes_the_kappa_its_own_points_measured(tmp_path):
    """One wave (d <= 16 on this shape) and several need not share kappa: each point's own,
    interpolated in log d between them."""
    kap = {4: 2.0, 8: 2.0, 16: 2.2, 32: 3.2}
    cost = ProfileCost.from_json(_write(tmp_path, _profile_doc(lambda d: kap[d])), ctx_quantum=1)
    for d, k in kap.items():
        assert cost.kappa_at(d) == pytest.approx(k, rel=0.02)
    assert 2.2 < cost.kappa_at(24) < 3.2
    assert cost.kappa_at(100) == pytest.approx(3.2, rel=0.02)   # held past the last point
    assert cost.spread_kappa == pytest.approx(2.1, rel=0.02)     # the median, reported


def test_a_kappa_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="kappa"):
        ProfileCost.from_json(_write(tmp_path, _profile_doc(None)), decode_spread=0.5)
    with pytest.raises(ValueError, match="kappa"):
        launch_time(np.full(600, 10.0), 528, 0.9)


def test_the_several_wave_path_is_list_scheduling_then_the_drain():
    """Against a plain event-by-event simulation of the same processor sharing."""
    import heapq

    def slow(works, r, kappa):
        heap, v, t, nxt = [], 0.0, 0.0, 0
        while nxt < len(works) and len(heap) < r:
            heapq.heappush(heap, works[nxt])
            nxt += 1
        while heap:
            rate = min(kappa / r, 1.0 / len(heap))
            f = heapq.heappop(heap)
            t += (f - v) / rate
            v = f
            if nxt < len(works):
                heapq.heappush(heap, v + works[nxt])
                nxt += 1
        return t

    rng = np.random.default_rng(7)
    for n in (529, 900, 2048):
        for kappa in (1.0, 2.5, 8.0):
            works = rng.integers(1, 3000, n).astype(float)
            assert launch_time(works, 528, kappa) == pytest.approx(slow(list(works), 528, kappa), rel=1e-12)
