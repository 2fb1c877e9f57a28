"""Issue 35, session 21: steps with prefill whose decodes have unequal contexts.

The profile's mixed spread points (session 20: each spread point's decodes beside one 256-token
chunk) ran 1.035-1.075 x the model at their decodes' mean context on the H100's 6.7B, and the live
steps with a 129-256-token chunk ran 0.96-0.98 of the model at max / mean context >= 3 against ~1.00
below 2 (bench/results/fidelity_grid_h100_s21). `ProfileCost` now reads each mixed spread point as a
multiple of its decodes' total context, solves it for a kappa of its own on the decode launch plan
without splits (a mixed step's launch: its chunk's query blocks fill the machine, so one split), and
the event loop and the live-step scorer charge a step with prefill its decodes' total context times
that multiple."""
import json
from dataclasses import replace

import numpy as np
import pytest

from bench.simulator import fidelity_steps
from sims.decode_spread import DecodeLaunchPlan, spread_factor
from sims.profile_cost import ProfileCost

BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]
PLAN = DecodeLaunchPlan.legacy(32, BUCKETS, 16384)
NO_SPLIT = replace(PLAN, splits=(1,) * len(PLAN.splits))


def _decode_s(d, c):
    return 4e-3 + 3e-5 * d + 2e-7 * d * c


def _mixed_s(d, p, dec_ctx):
    return 6e-3 + 2e-5 * p + 3e-5 * d + 2e-7 * dec_ctx


def _doc(mixed_kappa=None):
    """A synthetic CUDA profile (the 6.7B's launch plan): decode, prefill and mixed points at even
    contexts and, with `mixed_kappa`, mixed spread points timed by the launch model at that kappa."""
    pts = []
    for c in (512, 1024, 2048):
        for d in (1, 2, 4, 8, 16, 32, 64):
            pts.append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": c,
                        "num_context_tokens": d * c, "step_ms": 1e3 * _decode_s(d, c)})
            for p in (64, 256):
                pts.append({"num_decode_seqs": d, "num_prefill_tokens": p, "num_prefill_seqs": 1,
                            "context_len": c, "num_context_tokens": d * c + p,
                            "step_ms": 1e3 * _mixed_s(d, p, d * c)})
    for p in (128, 256, 512):
        pts.append({"num_decode_seqs": 0, "num_prefill_tokens": p, "context_len": 0,
                    "num_context_tokens": p, "step_ms": 1e3 * (6e-3 + 2e-5 * p)})
    plan = {str(b): {"splits": s, "resident_programs": r} for b, s, r in zip(PLAN.buckets, PLAN.splits, PLAN.resident)}
    doc = {"format": "tidegate-profile/1", "model": "deepseek-coder-6.7b", "device": "cuda", "num_kv_blocks": 20000,
           "block_size": 16, "max_model_len": 16384, "cuda_graph_decode_buckets": BUCKETS,
           "cuda_graph_token_buckets": [], "points": pts,
           "decode_attention": {"kernel": "triton", "num_kv_heads": 32, "sm_count": 132, "block_n": 64,
                                "split_context_len": 16384, "buckets": plan}}
    for d in (2, 4, 8, 16, 32):  # decode-only spread points (the decode term needs its plan read)
        ctxs = [512] * (d - 1) + [2048]
        t = _decode_s(d, sum(ctxs) * spread_factor(ctxs, PLAN, 2.5) / d)
        pts.append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": round(sum(ctxs) / d),
                    "num_context_tokens": sum(ctxs), "step_ms": 1e3 * t,
                    "decode_context_lens": [[d - 1, 512], [1, 2048]], "decode_spread": "one_long"})
    if mixed_kappa is not None:
        for d in (4, 8, 16, 32):
            ctxs = [512] * (d - 1) + [2048]
            t = _mixed_s(d, 256, sum(ctxs) * spread_factor(ctxs, NO_SPLIT, mixed_kappa))
            pts.append({"num_decode_seqs": d, "num_prefill_tokens": 256, "num_prefill_seqs": 1,
                        "prefill_context_len": 0, "context_len": round(sum(ctxs) / d),
                        "num_context_tokens": sum(ctxs) + 256, "step_ms": 1e3 * t,
                        "decode_context_lens": [[d - 1, 512], [1, 2048]], "decode_spread": "one_long"})
    return doc


def _cost(tmp_path, doc, name="p.json", **kw):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return ProfileCost.from_json(path, ctx_quantum=1, **kw)


def test_the_profile_reads_the_mixed_kappa_back_from_its_points(tmp_path):
    cost = _cost(tmp_path, _doc(mixed_kappa=4.0))
    assert cost.charges_mixed_spread
    assert [m["kappa"] for m in cost.mixed_point_kappas] == pytest.approx([4.0] * 4, rel=0.05)
    assert all(m["context_multiple"] > 1.0 for m in cost.mixed_point_kappas)
    assert cost.describe()["mixed_spread"]["points"] == cost.mixed_point_kappas
    # the decode-only term is its own: the mixed points move neither its kappa nor the fit
    base = _cost(tmp_path, _doc(), "b.json")
    assert not base.charges_mixed_spread and "mixed_spread" not in base.describe()
    assert cost.spread_point_kappas == base.spread_point_kappas and np.array_equal(cost.coef, base.coef)


def test_unequal_decodes_beside_a_chunk_cost_more_and_off_turns_it_off(tmp_path):
    doc = _doc(mixed_kappa=4.0)
    cost = _cost(tmp_path, doc)
    even, spread = [704] * 16, [512] * 15 + [3584]
    assert cost.mixed_context_multiple(even) == pytest.approx(1.0)
    m = cost.mixed_context_multiple(spread)
    assert m == pytest.approx(spread_factor(spread, NO_SPLIT, 4.0), rel=0.02) and m > 1.2
    off = _cost(tmp_path, doc, "off.json", mixed_spread="off")
    assert not off.charges_mixed_spread and off.mixed_context_multiple(spread) == 1.0
    for bad in ("often", 0.5):
        with pytest.raises(ValueError, match="mixed_spread"):
            _cost(tmp_path, doc, "bad.json", mixed_spread=bad)
    # a what-if kappa on a profile without mixed spread points charges as measured ones at that kappa
    whatif = _cost(tmp_path, _doc(), "whatif.json", mixed_spread=4.0)
    assert whatif.charges_mixed_spread and whatif.mixed_point_kappas == []
    assert whatif.mixed_context_multiple(spread) == pytest.approx(spread_factor(spread, NO_SPLIT, 4.0))


def test_the_live_step_scorer_charges_a_mixed_step_for_its_decodes_spread(tmp_path):
    doc = _doc(mixed_kappa=4.0)
    cost, off = _cost(tmp_path, doc), _cost(tmp_path, doc, "off.json", mixed_spread="off")

    def step(ctxs, p):
        return {"d": len(ctxs), "p": p, "ctx": sum(ctxs), "ctxs": ctxs, "chunks": [(p, 0)] if p else [],
                "start": 0.0, "end": 0.02, "idle_before": False, "ms": 20.0}

    spread, even = [512] * 15 + [3584], [704] * 16
    (_, t_spread, _), (_, t_even, _) = fidelity_steps.model_step_ms(cost, [step(spread, 256), step(even, 256)])
    (_, o_spread, _), (_, o_even, _) = fidelity_steps.model_step_ms(off, [step(spread, 256), step(even, 256)])
    assert t_even == pytest.approx(o_even) and o_spread == pytest.approx(o_even)
    m = cost.mixed_context_multiple(spread)
    assert t_spread == pytest.approx(1e3 * cost.step_time(16, 256, int(sum(spread) * m) + 256, [(256, 0)]))
    assert t_spread > t_even * 1.02
    # a decode-only step is the decode term's, not this one's
    (_, d_on, _), = fidelity_steps.model_step_ms(cost, [step(spread, 0)])
    (_, d_off, _), = fidelity_steps.model_step_ms(off, [step(spread, 0)])
    assert d_on == pytest.approx(d_off)


def test_the_simulator_charges_mixed_steps_of_a_spread_workload_more(tmp_path):
    """End to end: mixed prompt lengths through the event loop, with and without the term: TPOT
    rises (steps with prefill lengthen); equal prompts barely move."""
    from sims.runner import CostSpec, RunSpec, run_spec
    from sims.workload import LengthSpec, WorkloadConfig
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc(mixed_kappa=2.0)))

    def tpot(mixed, input_len):
        spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(path), mixed_spread=mixed),
                       workload=WorkloadConfig(num_requests=80, rate=40.0, input_len=LengthSpec.parse(input_len),
                                               output_len=LengthSpec.parse(48), seed=3))
        return run_spec(spec)["tpot_ms"]["p50"]

    drawn = "lognormal:512:0.9"
    assert tpot("measured", drawn) > tpot("off", drawn) * 1.005
    assert tpot("measured", "512") == pytest.approx(tpot("off", "512"), rel=0.01)
