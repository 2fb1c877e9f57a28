"""Issue 35, session 33: a step with prefill charged for its decodes' whole attention tiles
(`ProfileCost(mixed_tiles="on")`, sims.profile_cost "Whole tiles beside a chunk").

In a step with prefill the paged kernel runs each decode as a program of 64 query rows over 64-token
tiles of its context, and a partly valid tile costs the whole tile. The profile's mixed points sit on
multiples of 64; live contexts do not. On an H100's 6.7B FP8 part the busy mixed steps read the raw
model 0.973-0.986 of live, falling with d; charged by whole tiles 0.991-0.9995 at every d
(bench/results/conditioned_s33). Since session 35 the default charges the fraction of a tile the
profile's tile-edge pairs measure (`mixed_tiles="measured"`; none on a profile without them)."""
import json

import pytest

from bench.simulator import fidelity_steps
from bench.simulator.fidelity_table import model_label
from sims.profile_cost import MIXED_BLOCK_N, ProfileCost
from tests.test_sims_mixed_spread import _doc


def _cost(tmp_path, doc, name="p.json", **kw):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return ProfileCost.from_json(path, ctx_quantum=1, **kw)


def test_the_tile_is_the_kernels_for_steps_with_prefill():
    from backend.kernels.paged_attention import BLOCK_N, QUANT_BLOCK_N
    assert MIXED_BLOCK_N == BLOCK_N  # quantized pages tile decode-only steps by QUANT_BLOCK_N only
    assert QUANT_BLOCK_N % MIXED_BLOCK_N == 0


def test_whole_tiles_none_without_pairs_on_when_asked(tmp_path):
    doc = _doc()  # no mixed spread points, no tile-edge pairs: only the tiles term "on" can charge
    off = _cost(tmp_path, doc)
    assert not off.mixed_tiles and not off.charges_mixed_spread
    assert off.mixed_context_multiple([577, 600]) == 1.0
    on = _cost(tmp_path, doc, "on.json", mixed_tiles="on")
    assert on.mixed_tiles and on.charges_mixed_spread
    assert on.mixed_context_multiple([576]) == 1.0                      # on a tile edge: no change
    assert on.mixed_context_multiple([577]) == pytest.approx(640 / 577)  # one key in the last tile
    assert on.mixed_context_multiple([512, 577, 640]) == pytest.approx((512 + 640 + 640) / (512 + 577 + 640))
    with pytest.raises(ValueError, match="mixed_tiles"):
        _cost(tmp_path, doc, "bad.json", mixed_tiles="sometimes")


def test_tiles_and_the_spread_term_multiply(tmp_path):
    doc = _doc(mixed_kappa=4.0)
    spread_only = _cost(tmp_path, doc)
    both = _cost(tmp_path, doc, "both.json", mixed_tiles="on")
    ctxs = [513] * 15 + [3585]
    whole = (15 * 576 + 3648) / sum(ctxs)
    assert both.mixed_context_multiple(ctxs) == pytest.approx(whole * spread_only.mixed_context_multiple(ctxs))


def test_the_live_step_scorer_charges_one_decode_beside_a_chunk_its_tiles(tmp_path):
    doc = _doc()
    on, off = _cost(tmp_path, doc, mixed_tiles="on"), _cost(tmp_path, doc, "off.json")

    def step(ctxs, p):
        return {"d": len(ctxs), "p": p, "ctx": sum(ctxs), "ctxs": ctxs, "chunks": [(p, 0)] if p else [],
                "start": 0.0, "end": 0.02, "idle_before": False, "ms": 20.0}

    steps = [step([577], 256), step([640], 256), step([577] * 8, 256), step([577] * 8, 0)]
    t_on = [t for _, t, _ in fidelity_steps.model_step_ms(on, steps)]
    t_off = [t for _, t, _ in fidelity_steps.model_step_ms(off, steps)]
    assert t_on[0] == pytest.approx(t_on[1], rel=1e-4)    # 577 beside a chunk costs as 640
    assert t_off[0] < t_off[1]
    assert t_on[2] == pytest.approx(1e3 * on.step_time(8, 256, 8 * 640 + 256, [(256, 0)]), rel=1e-4)
    assert t_on[3] == pytest.approx(t_off[3])             # decode-only steps: not this term's


def _sim_tpot_p50(tmp_path, num_requests: int, rate: float, **cost_terms) -> float:
    """The simulator's TPOT P50 (ms) on the synthetic profile: prompts of 500 tokens (off the tile
    edges), 48 out, with these CostSpec terms."""
    from sims.runner import CostSpec, RunSpec, run_spec
    from sims.workload import LengthSpec, WorkloadConfig
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc()))
    spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(path), **cost_terms),
                   workload=WorkloadConfig(num_requests=num_requests, rate=rate, input_len=LengthSpec.parse("500"),
                                           output_len=LengthSpec.parse(48), seed=3))
    return run_spec(spec)["tpot_ms"]["p50"]


def test_the_simulator_lengthens_mixed_steps_off_the_tile_edges(tmp_path):
    """End to end through the event loop: prompts off the tile edges (500 + outputs) charge their
    mixed steps more with the term on; TPOT rises a little, never falls."""
    def tpot(tiles):
        return _sim_tpot_p50(tmp_path, 80, 40.0, mixed_tiles=tiles)

    assert tpot("on") > tpot("off") * 1.001


def test_the_table_names_the_term():
    assert "mixed tiles" in model_label({"hide_launch": True, "mixed_tiles": "on"})
    assert "mixed tiles" not in model_label({"hide_launch": True})


def test_on_the_conditioned_h100_part_whole_tiles_take_the_slope_in_d_out_of_the_mixed_steps():
    """The committed part (bench/results/conditioned_s33, 6.7B FP8 on an H100, its own profile): the
    busy one-chunk mixed steps' raw charge over live, by d bin. At their contexts it falls with d
    (0.986 -> 0.973); at their whole tiles it is flat within a point and within 1.5 % of live."""
    from pathlib import Path

    from scheduler.decisions import read_log
    part = Path(__file__).resolve().parents[1] / "bench/results/conditioned_s33/h100_6.7b-fp8/6.7b-fp8"
    arr, _ = read_log(part / "decisions_6.7b-fp8.jsonl.gz")
    steps, bad = fidelity_steps.live_steps(fidelity_steps.read_steps(part / "steps_6.7b-fp8.jsonl.gz"),
                                           {a.request_id: a.max_tokens for a in arr})
    assert bad == 0
    # device times, as live; the spread term off, so the tiles term is the only difference
    cost = ProfileCost.from_json(part / "profile_6.7b-fp8.json", hide_launch=True, mixed_spread="off",
                                 mixed_tiles="on")
    ratios = {False: [], True: []}
    for lo, hi in ((8, 15), (16, 31), (32, 47), (48, 63)):
        sel = [s for s in steps if s["p"] == 256 and lo <= s["d"] <= hi and not s["idle_before"]
               and len(s["chunks"]) == 1]
        live = sum(s["ms"] for s in sel)
        for tiles in (False, True):
            charge = 0.0
            for s in sel:
                total = sum(s["ctxs"])
                dec = round(total * cost.mixed_context_multiple(s["ctxs"])) if tiles else total
                charge += 1e3 * cost.step_time(s["d"], 256, s["ctx"] - total + dec, s["chunks"])
            ratios[tiles].append(charge / live)
    assert max(ratios[False]) - min(ratios[False]) > 0.01, ratios
    assert max(ratios[True]) - min(ratios[True]) < 0.01, ratios
    assert all(abs(r - 1) < 0.015 for r in ratios[True]), ratios
    assert all(t > f for t, f in zip(ratios[True], ratios[False], strict=True))


def _with_off_edge_points(doc, phi_mixed, phi_decode, ds=(8, 16, 32)):
    """The profile's off-edge points (session 34, `--tile-edge-points`): every decode at 513, one token
    past a tile, timed as if a partial tile cost these fractions of a whole one (63 tokens short of it)."""
    from tests.test_sims_mixed_spread import _decode_s, _mixed_s
    for d in ds:
        doc["points"].append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": 513,
                              "num_context_tokens": d * 513, "decode_context_lens": [[d, 513]],
                              "decode_spread": "off_edge", "step_ms": 1e3 * _decode_s(d, 513 + phi_decode * 63)})
        doc["points"].append({"num_decode_seqs": d, "num_prefill_tokens": 256, "num_prefill_seqs": 1,
                              "prefill_context_len": 0, "context_len": 513, "num_context_tokens": d * 513 + 256,
                              "decode_context_lens": [[d, 513]], "decode_spread": "off_edge",
                              "step_ms": 1e3 * _mixed_s(d, 256, d * (513 + phi_mixed * 63))})
    return doc


def test_off_edge_points_are_recorded_not_charged(tmp_path):
    """Session 34's off-edge points (every decode one key past a tile, read against the fit) give the
    fractions they read (`tile_fractions`, the model's summary), but since session 35 "measured" charges
    only the tile-edge pairs': read against the fit a partial tile is the size of its residual
    (bench/results/tiles_s35: -0.4 to 8 of a tile per point on an H100 profile)."""
    doc = _with_off_edge_points(_doc(), phi_mixed=0.6, phi_decode=0.33)
    cost = _cost(tmp_path, doc)          # the defaults: both tiles terms "measured"
    assert cost.tile_fractions["mixed"] == pytest.approx(0.6, abs=0.02)
    assert cost.tile_fractions["decode"] == pytest.approx(0.33, abs=0.02)
    assert cost.describe()["tile_edges"]["fractions"] == cost.tile_fractions
    assert (cost.mixed_tiles_mode, cost.decode_tiles_mode) == ("measured", "measured")
    assert cost.mixed_tiles == 0.0 and cost.decode_tiles == 0.0 and not cost.charges_mixed_spread
    assert cost.mixed_context_multiple([577]) == 1.0
    # kept out of the fit: the surface at the grid's contexts is the one without them
    plain = _cost(tmp_path, _doc(), "plain.json")
    assert len(cost.points) == len(plain.points)
    assert cost.step_time(16, 256, 16 * 576 + 256, [(256, 0)]) == pytest.approx(
        plain.step_time(16, 256, 16 * 576 + 256, [(256, 0)]), rel=1e-9)
    # "on" stays whole tiles with the points there
    on = _cost(tmp_path, doc, "on.json", mixed_tiles="on")
    assert on.mixed_context_multiple([577]) == pytest.approx(640 / 577)
    assert model_label({"mixed_tiles": "measured"}).endswith("mixed tiles measured")


def test_measured_charges_the_pairs_fraction_held_within_a_tile(tmp_path):
    """The pairs' fractions are what "measured" charges (on a CUDA profile), held within [0, 1]: a
    fraction read past 1 (the H100 pairs beside a chunk read 1.01-1.10) is a whole tile; a CPU
    profile's pairs are recorded, not charged (its attention runs no tiles)."""
    cost = _cost(tmp_path, _with_tile_pairs(_doc(), 0.6, 0.33))
    assert cost.mixed_tiles == pytest.approx(0.6, abs=0.01) and cost.charges_mixed_spread
    assert cost.mixed_context_multiple([577]) == pytest.approx((577 + cost.mixed_tiles * 63) / 577)
    assert cost.mixed_context_multiple([576]) == 1.0
    hi = _cost(tmp_path, _with_tile_pairs(_doc(), 1.3, 0.3), "hi.json")
    assert hi.tile_fractions["mixed"] == pytest.approx(1.3, abs=0.02) and hi.mixed_tiles == 1.0
    off = _cost(tmp_path, _with_tile_pairs(_doc(), 0.6, 0.33), "off.json", mixed_tiles="off", decode_tiles="off")
    assert (off.mixed_tiles, off.decode_tiles) == (0.0, 0.0) and off.tile_fractions == cost.tile_fractions
    cpu = _with_tile_pairs(_doc(), 0.6, 0.33)
    cpu["device"] = "cpu"
    on_cpu = _cost(tmp_path, cpu, "cpu.json")
    assert on_cpu.tile_fractions == pytest.approx(cost.tile_fractions, abs=0.01)
    assert (on_cpu.mixed_tiles, on_cpu.decode_tiles) == (0.0, 0.0)
    none = _cost(tmp_path, _doc(), "none.json")
    assert none.mixed_tiles == 0.0 and not none.charges_mixed_spread


def test_decode_tiles_charge_decode_only_steps_their_partial_tiles(tmp_path):
    """`decode_tiles` (session 34): one key past a tile cost a decode-only step about a third of a whole
    tile on an H100 (bench/results/tiles_s34: 0.22-0.53, median 0.31); "measured" (the default since
    session 35) reads the profile's decode-only tile-edge pairs, a fraction is a what-if, "off" charges
    their contexts."""
    doc = _with_tile_pairs(_doc(), phi_mixed=0.6, phi_decode=0.33)
    off = _cost(tmp_path, doc, decode_tiles="off")
    assert off.decode_tiles == 0.0 and off.decode_context_multiple([577]) == 1.0
    measured = _cost(tmp_path, doc, "m.json")   # the default since session 35
    assert measured.decode_tiles == pytest.approx(0.33, abs=0.02)
    bn = measured.decode_plan.block_n
    assert bn == 64
    assert measured.decode_context_multiple([577]) == pytest.approx((577 + measured.decode_tiles * 63) / 577)
    assert measured.decode_context_multiple([576, 640]) == pytest.approx(off.decode_context_multiple([576, 640]))
    # with the spread term's kappa: the two multiply
    half = _cost(tmp_path, doc, "h.json", decode_tiles=0.5)
    ctxs = [513] * 15 + [2049]
    tiles = (sum(ctxs) + 0.5 * (15 * 63 + 63)) / sum(ctxs)
    assert half.decode_context_multiple(ctxs) == pytest.approx(tiles * off.decode_context_multiple(ctxs))
    # the live step scorer charges one decode alone its partial tile too; steps with prefill are not this term's
    steps = [{"d": 1, "p": 0, "ctx": 577, "ctxs": [577], "chunks": [], "start": 0.0, "end": 0.01,
              "idle_before": False, "ms": 10.0},
             {"d": 1, "p": 0, "ctx": 577 + 31, "ctxs": [577 + 31], "chunks": [], "start": 0.01, "end": 0.02,
              "idle_before": False, "ms": 10.0},
             {"d": 8, "p": 256, "ctx": 8 * 577, "ctxs": [577] * 8, "chunks": [(256, 0)], "start": 0.02,
              "end": 0.04, "idle_before": False, "ms": 20.0}]
    t_half = [t for _, t, _ in fidelity_steps.model_step_ms(half, steps)]
    t_off = [t for _, t, _ in fidelity_steps.model_step_ms(off, steps)]
    assert t_half[0] == pytest.approx(t_off[1], rel=1e-3)  # 577 + half of its 63 missing tokens
    assert t_half[2] == pytest.approx(t_off[2])
    for bad in ("sometimes", 1.5, -0.1):
        with pytest.raises(ValueError, match="decode_tiles"):
            _cost(tmp_path, doc, "bad.json", decode_tiles=bad)
    assert "decode tiles 0.31" in model_label({"decode_tiles": 0.31})


def test_the_simulator_lengthens_decode_steps_by_their_partial_tiles(tmp_path):
    """End to end through the event loop (CostSpec.decode_tiles): decode-only steps off the tile edges
    cost more with the term on, so TPOT rises by a little, and more at a larger fraction."""
    def tpot(tiles):
        return _sim_tpot_p50(tmp_path, 40, 10.0, decode_tiles=tiles)

    base, third, whole = tpot("off"), tpot(0.33), tpot(1.0)
    assert base * 1.0005 < third < whole


def _with_tile_pairs(doc, phi_mixed, phi_decode, ds=(8, 16, 32), offset_ms=0.0, next_twin=False, card=1.0):
    """The profile's tile-edge pairs (session 35, `--tile-edge-pairs`): every decode at 512 (on a tile
    edge), at 513 and (`next_twin`) at 640, timed as if a partial tile cost these fractions of a whole
    one; `offset_ms` moves every twin alike (what a fit residual or a clock drop does to a point read
    against the fit); `card` scales the card's cost of a context token over the synthetic surface's
    (a slope the fit's grid points do not give)."""
    from tests.test_sims_mixed_spread import _decode_s, _mixed_s

    def step(p, d, c):  # ms, the context past 512 at the card's own cost a token
        c = 512 + card * (c - 512)
        return 1e3 * (_mixed_s(d, p, d * c) if p else _decode_s(d, c)) + offset_ms

    pairs = []
    for d in ds:
        for p, phi in ((0, phi_decode), (256, phi_mixed)):
            on, off, nxt = step(p, d, 512), step(p, d, 513 + phi * 63), step(p, d, 640)
            pr = {"num_decode_seqs": d, "num_prefill_tokens": p, "num_prefill_seqs": 1 if p else 0,
                  "on_context": 512, "off_context": 513, "rounds": 4, "on_ms_median": on,
                  "off_ms_median": off, "diff_ms_median": off - on}
            if next_twin:
                pr |= {"next_context": 640, "next_ms_median": nxt, "whole_ms_median": nxt - on}
            pairs.append(pr)
    doc["tile_edge_pairs"] = pairs
    return doc


def test_measured_reads_the_fraction_of_a_tile_from_the_tile_edge_pairs(tmp_path):
    """Session 35: read against the fit, an off-edge point's partial tile (0.5-2.5 % of a step) is the
    size of the fit's residual, and the H100 6.7B mixed-lengths profile's points gave -0.4 to 8 of a
    tile (bench/results/tiles_s35). The pairs time the edge and the edge + 1 in turn, and the model
    reads their difference: a shift common to both twins does not move the fraction, where the same
    shift on an off-edge point does."""
    doc = _with_tile_pairs(_doc(), phi_mixed=0.6, phi_decode=0.33)
    cost = _cost(tmp_path, doc, mixed_tiles="measured", decode_tiles="measured")
    assert cost.tile_fractions == {"mixed": pytest.approx(0.6, abs=0.01), "decode": pytest.approx(0.33, abs=0.01)}
    assert cost.mixed_tiles == cost.tile_fractions["mixed"] and cost.decode_tiles == cost.tile_fractions["decode"]
    assert {e["source"] for e in cost.tile_edge_points} == {"pairs"}
    assert cost.describe()["tile_edges"]["fractions"] == cost.tile_fractions
    # a 0.2 ms shift of both twins (~2-3 % of these steps): the pairs read the same fractions ...
    shifted = _cost(tmp_path, _with_tile_pairs(_doc(), 0.6, 0.33, offset_ms=0.2), "s.json", mixed_tiles="measured")
    assert shifted.tile_fractions == pytest.approx(cost.tile_fractions, abs=1e-3)
    # ... where the off-edge points, read against the fit, are thrown far off by it
    doc_pts = _with_off_edge_points(_doc(), phi_mixed=0.6, phi_decode=0.33)
    for p in doc_pts["points"]:
        if p.get("decode_spread") == "off_edge":
            p["step_ms"] += 0.2
    points = _cost(tmp_path, doc_pts, "pts.json", mixed_tiles="measured")
    assert abs(points.tile_fractions["mixed"] - 0.6) > 0.5 and abs(points.tile_fractions["decode"] - 0.33) > 0.5
    # where a profile has both, the pairs decide
    both = _with_tile_pairs(_with_off_edge_points(_doc(), 1.3, 0.9), 0.6, 0.33)
    assert _cost(tmp_path, both, "b.json").tile_fractions == pytest.approx(cost.tile_fractions)
    # a pair whose tile ends past the grid's longest decode context is not read
    far = _doc()
    far = _with_tile_pairs(far, 0.6, 0.33)
    for pr in far["tile_edge_pairs"]:
        pr["on_context"], pr["off_context"] = 2048, 2049
    assert _cost(tmp_path, far, "far.json", mixed_tiles="measured").tile_fractions == {}


def test_the_pairs_next_twin_measures_the_whole_tile(tmp_path):
    """Since the pairs' second form each shape is timed at the next 128-token edge too: the whole tile
    measured on the card, not charged at the fit's context cost. Where the card's tile costs 1.5x what
    the fit's grid points give, the fit-read fraction is 1.5x too high; the measured one is right."""
    fit_read = _cost(tmp_path, _with_tile_pairs(_doc(), 0.6, 0.33, card=1.5), "f.json")
    measured = _cost(tmp_path, _with_tile_pairs(_doc(), 0.6, 0.33, card=1.5, next_twin=True), "m.json",
                     mixed_tiles="measured", decode_tiles="measured")
    assert fit_read.tile_fractions == {"mixed": pytest.approx(0.9, abs=0.02), "decode": pytest.approx(0.5, abs=0.02)}
    assert measured.tile_fractions == {"mixed": pytest.approx(0.6, abs=0.01), "decode": pytest.approx(0.33, abs=0.01)}
    assert {e["whole_tile"] for e in measured.tile_edge_points} == {"measured"}
    assert {e["whole_tile"] for e in fit_read.tile_edge_points} == {"fit"}
    assert (measured.mixed_tiles, measured.decode_tiles) == (measured.tile_fractions["mixed"],
                                                             measured.tile_fractions["decode"])
    # a measured whole tile is read past the grid's contexts too (nothing there is the fit's)
    far = _with_tile_pairs(_doc(), 0.6, 0.33, next_twin=True)
    for pr in far["tile_edge_pairs"]:
        pr["on_context"], pr["off_context"], pr["next_context"] = 2048, 2049, 2176
    assert _cost(tmp_path, far, "far.json").tile_fractions == pytest.approx(measured.tile_fractions, abs=0.01)


def test_the_default_charges_a_cuda_profiles_pairs_and_names_them(tmp_path):
    """Since session 35 the simulator's default (`CostSpec`) charges the fractions a CUDA profile's
    tile-edge pairs measure, and `sim validate` names the terms (its tables' label) only there: a
    profile without pairs, or a CPU one, is charged and labelled as before."""
    from bench.simulator.validate import model_terms
    from sims.runner import CostSpec, RunSpec, run_spec
    from sims.workload import LengthSpec, WorkloadConfig

    doc = _with_tile_pairs(_doc(), 0.6, 0.33)
    assert model_terms(doc, 1e-3)["mixed_tiles"] == model_terms(doc, 1e-3)["decode_tiles"] == "measured"
    assert "mixed_tiles" not in model_terms(dict(doc, device="cpu"), None)
    assert "mixed_tiles" not in model_terms(_doc(), 1e-3)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(doc))

    def tpot(**terms):
        spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(path), **terms),
                       workload=WorkloadConfig(num_requests=40, rate=10.0, input_len=LengthSpec.parse("500"),
                                               output_len=LengthSpec.parse(48), seed=3))
        return run_spec(spec)["tpot_ms"]["p50"]

    assert tpot() > tpot(mixed_tiles="off", decode_tiles="off") * 1.0005
    assert tpot() == pytest.approx(tpot(mixed_tiles="measured", decode_tiles="measured"))
