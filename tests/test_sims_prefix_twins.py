"""The cached-prefix term from the profile's twins (`sims.profile_cost`, "The prefix term from twins").

The H200 grid's profiles measure cached-prefix chunks at one start (256), each beside a twin at
start 0. Live, chunks start anywhere up to the longest prompt. The model must charge a chunk more the
longer the prefix it attends to, by the twins' own slope, and not by a residual surface that was
measured at one start only (which charged session 25's 6.7B a 256-token chunk less at start 1,024
than at start 0).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sims.profile_cost import ProfileCost

ROOT = Path(__file__).resolve().parents[1]
S25 = ROOT / "bench/results/fidelity_grid_h200_s25"
PROFILES = [S25 / "6.7b-mixed-seeds/profile_6.7b-mixed-seeds.json", S25 / "33b-mixed-1/profile_33b-mixed-1.json"]


def charges(cost: ProfileCost, d: int, per_seq: int, starts) -> np.ndarray:
    """A 256-token chunk beside d decodes of `per_seq` context each, at each start, in ms."""
    return np.array([1e3 * cost.step_time(d, 256, d * per_seq + 256 + s, [(256, s)]) for s in starts])


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.parent.name)
def test_a_longer_prefix_costs_more_by_the_twins_slope(path):
    cost = ProfileCost.from_json(path, hide_launch=True)
    term = cost.describe()["prefix_term"]
    assert term["from"] == "twins" and term["pairs"] == 8
    # the reference: the twins' differences read straight from the JSON, less the context term's
    # share of the 256 extra context tokens, least squares through the origin in p·s
    pts = json.loads(path.read_text())["points"]
    def key(q, ctx):  # the shape but for the prefix (packed points share d, p and ctx with the twins)
        return (q["num_decode_seqs"], q["num_prefill_tokens"], q.get("num_prefill_seqs", 1),
                q.get("num_draft_tokens", 0), ctx)
    base = {key(q, q["num_context_tokens"]): q["device_ms_median"]
            for q in pts if q.get("prefill_context_len", 0) == 0 and not q.get("decode_context_lens")}
    xs, ys = [], []
    e = cost.coef[3]
    for q in pts:
        s = q.get("prefill_context_len", 0)
        if s > 0:
            twin = base[key(q, q["num_context_tokens"] - s)]
            xs.append(q["num_prefill_tokens"] * s)
            ys.append((q["device_ms_median"] - twin) * 1e-3 - e * s)
    xs, ys = np.array(xs, dtype=float), np.array(ys)
    h = float(xs @ ys / (xs @ xs))
    # e comes from a regression over the start-0 points, the model's from one over all: a 256-token
    # context difference of e is a few microseconds against differences of 0.2-1.3 ms
    assert term["h_s"] == pytest.approx(h, rel=0.02)
    starts = [0, 256, 512, 1024, 1536, 2048]
    for d in (1, 16, 32, 64):
        t = charges(cost, d, 700, starts)
        step = np.diff(t) / np.diff(starts)  # ms a prefix token
        # the charge rises with the start by h·p a prefix token (plus the context term's e),
        # the residuals not moving with the prefix
        assert np.all(step > 0), (d, t)
        np.testing.assert_allclose(step, 1e3 * (term["h_s"] * 256 + e), rtol=0.15)


def test_the_fitted_form_is_the_model_before():
    """`prefix_term="fit"` keeps the regression's coefficient and the residual axis: on session 25's
    6.7B it charged the chunk at start 1,024 less than at start 0 (what the twins fix)."""
    cost = ProfileCost.from_json(PROFILES[0], hide_launch=True, prefix_term="fit")
    assert cost.describe()["prefix_term"] == "fit"
    t = charges(cost, 16, 700, [0, 512, 1024])
    assert t[2] < t[0] < t[1]
    with pytest.raises(ValueError, match="twins or fit"):
        ProfileCost.from_json(PROFILES[0], prefix_term="both")


def test_prefix_points_without_twins_fall_back_to_the_fit(tmp_path):
    doc = json.loads(PROFILES[0].read_text())
    # a profile whose start-0 points are not the prefix points' twins (their context moved)
    for q in doc["points"]:
        if q.get("prefill_context_len", 0) > 0:
            q["num_context_tokens"] += 64
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    cost = ProfileCost.from_json(path, hide_launch=True)
    assert cost.describe()["prefix_term"] == "fit"
    assert "h_s_per_prefill_tok_prefix_tok" in cost.describe()["coef"]
