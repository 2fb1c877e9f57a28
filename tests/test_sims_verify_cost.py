"""The simulator's cost of speculating steps (issue 28): the measured profile reproduces its verify
points and the decode steps just past them, a mixed step has its own constant and a compute knee,
and a drafting step, which the CUDA engine cannot pipeline, pays the host's launch."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scheduler.speculation import SpeculationConfig
from scheduler.step_plan import SchedulerConfig
from sims.cost import ConstantCost
from sims.profile_cost import ProfileCost
from sims.speculation import OracleAcceptance, simulate_speculation, synthetic_edit_requests

# the H200's verify-shaped profile (33B, dummy bf16 weights; 9-, 72- and 512-token chunks beside
# 0-32 decodes at 1,024- and 3,072-token contexts), device call 1 of 2026-12-04
PROFILE = Path(__file__).resolve().parents[1] / "bench/results/spec_h200_s9/profile_verify_33b.json"


def _points():
    for p in json.loads(PROFILE.read_text())["points"]:
        n = p.get("num_prefill_tokens", 0)
        k = p.get("num_prefill_seqs", 1) if n else 0
        chunks = [(n // k, p.get("prefill_context_len", 0))] * k if n else []
        yield p["num_decode_seqs"], n, p["num_context_tokens"], chunks, p["step_ms"]


def test_the_verify_profile_reproduces_its_points():
    cost = ProfileCost.from_json(PROFILE)
    for d, n, ctx, chunks, ms in _points():
        # contexts are charged in steps of 64 tokens (the memo's quantum): within 1%
        assert cost.step_time(d, n, ctx, chunks) * 1e3 == pytest.approx(ms, rel=0.01), (d, n, ctx, chunks)


def test_a_decode_step_just_past_a_measured_context_keeps_that_points_cost():
    """8 decodes at ~3,110 tokens each sit just outside the points' hull (8 x 3,072 is the largest
    8-decode context measured). The residual was 0 there and the bare regression charged 18.96 ms
    where the point measured 20.81 and live decode steps of the run took 20.84."""
    cost = ProfileCost.from_json(PROFILE)
    measured = next(ms for d, n, ctx, _, ms in _points() if (d, n, ctx) == (8, 0, 8 * 3072))
    assert cost.step_time(8, 0, 8 * 3110) * 1e3 == pytest.approx(measured, rel=0.01)
    assert cost.step_time(32, 0, 32 * 3300) * 1e3 > cost.step_time(32, 0, 32 * 3072) * 1e3 > 24.0


def _closed_form_ms(d, p, ctx):
    """Decode graph: 17 ms + 0.05 ms a sequence + 80 ns a context token. A step with prefill
    tokens runs the mixed graph: 3 ms more, 0.01 ms a prefill token, and 0.08 ms more a token of
    the step past 128 (the products turn compute-bound)."""
    t = 17.0 + 0.05 * d + 8e-5 * ctx
    if p:
        t += 3.0 + 0.01 * p + 0.08 * max(0, d + p - 128)
    return t


def _closed_form_profile(prefill_sizes):
    pts, times = [], []
    for d in (0, 1, 8, 32):
        for p in (0,) + tuple(prefill_sizes):
            for per_seq in (1024, 3072):
                if d + p == 0:
                    continue
                ctx = d * per_seq + p
                pts.append((d, p, ctx))
                times.append(_closed_form_ms(d, p, ctx) / 1e3)
    return ProfileCost(np.array(pts, dtype=np.float64), np.array(times))


def test_a_mixed_step_gets_its_own_constant_and_a_compute_knee():
    cost = _closed_form_profile((8, 64, 96, 512))  # 32 decodes + 96 tokens: a 128-token step
    coef = cost.describe()["coef"]
    assert coef["i_s_per_mixed_step"] * 1e3 == pytest.approx(3.0, rel=0.01)
    assert cost.describe()["compute_knee_tokens"] == 128.0
    # unmeasured verify-sized and medium steps, from the fit alone
    for d, p in ((4, 24), (7, 9), (16, 200), (2, 300)):
        ctx = d * 2000 + p
        assert cost.step_time(d, p, ctx) * 1e3 == pytest.approx(_closed_form_ms(d, p, ctx), rel=0.03), (d, p)


def test_a_profile_without_small_chunks_keeps_the_plain_line():
    """Only 512- and 1,024-token prefills: a mixed-step constant would be the line's intercept
    there (30 ms on the issue-35 H200 profile) and charge a 9-token chunk for it."""
    cost = _closed_form_profile((512, 1024))
    assert "i_s_per_mixed_step" not in cost.describe()["coef"]
    assert cost.describe()["compute_knee_tokens"] is None


class _LaunchCost(ConstantCost):
    def __init__(self, seconds, launch_s):
        super().__init__(seconds)
        self.launch_s = launch_s

    def launch_time(self, num_decode_seqs, num_prefill_tokens):
        return self.launch_s


def test_a_drafting_step_pays_the_hosts_launch_when_the_engine_pipelines():
    """Closed form: every step 20 ms; with async scheduling each step that verifies drafts adds
    the launch (1 ms), the others nothing; the CPU engine's turns add nothing."""
    reqs = synthetic_edit_requests(4, 256, 96, 1.0, seed=3)
    sched = SchedulerConfig(max_model_len=4096, num_blocks=4096, max_num_seqs=16,
                            max_num_batched_tokens=2048, block_size=16, enable_prefix_caching=True)
    for async_scheduling in (True, False):
        out = simulate_speculation(reqs, _LaunchCost(0.020, 0.001), sched, SpeculationConfig(),
                                   OracleAcceptance(), concurrency=4,
                                   async_scheduling=async_scheduling)
        drafting = sum(1 for s in out.steps if s[2])
        assert drafting > 5
        extra = drafting * 0.001 if async_scheduling else 0.0
        assert out.makespan == pytest.approx(len(out.steps) * 0.020 + extra, rel=1e-9)
        assert all(s[0] == pytest.approx(0.021 if (s[2] and async_scheduling) else 0.020)
                   for s in out.steps)


def test_the_profile_times_verify_steps_on_the_cpu(tmp_path):
    """`tidegate backend profile --verify-drafts K`: points whose chunks are verifies of K drafts
    (the engine's verify path: sampled at every position), read back as such by ProfileCost."""
    from bench.engine import profile as bprofile
    from gateway.tidegate_cli import main as tidegate

    chunks = bprofile.make_step(2, 8, 16, 16, 64, 50, k=2, s=32, verify=True)
    verifies = chunks[2:]
    assert [c.num_draft for c in verifies] == [3, 3] and not any(c.is_prefill for c in verifies)
    assert all(c.start_pos == 32 and len(c.token_ids) == 4 for c in verifies)
    out = tmp_path / "profile.json"
    rc = tidegate(["backend", "profile", "--model", "tiny", "--device", "cpu", "--num-blocks", "64",
                   "--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--max-model-len", "256",
                   "--decode-batch-sizes", "0,2", "--prefill-tokens", "0,8,32", "--context-lens", "16",
                   "--packed-prefill-seqs", "4", "--prefill-context-lens", "32", "--verify-drafts", "3",
                   # (the spread decode points, unequal contexts, are not this closed form's)
                   "--decode-spread-points", "off",
                   "--repeats", "1", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    pts = json.loads(out.read_text())["points"]
    verify = {(p["num_decode_seqs"], p["num_prefill_tokens"], p["num_prefill_seqs"],
               p["prefill_context_len"], p["num_draft_tokens"]) for p in pts if "num_draft_tokens" in p}
    assert verify == {(0, 4, 1, 32, 3), (0, 16, 4, 32, 12), (2, 4, 1, 32, 3), (2, 16, 4, 32, 12)}
    cost = ProfileCost.from_json(out)
    assert cost.measures_verifies and cost.describe()["verify_points"] == 4
    for p in pts:
        n, k = p["num_prefill_tokens"], p["num_prefill_seqs"]
        chunks = [(n // k, p["prefill_context_len"])] * k if n else []
        got = cost.step_time(p["num_decode_seqs"], n, p["num_context_tokens"], chunks,
                             num_draft_tokens=p.get("num_draft_tokens", 0))
        assert got * 1e3 == pytest.approx(p["step_ms"], rel=0.02, abs=0.05)


def _verify_profile(per_draft_ms):
    """The closed form above, plus `per_draft_ms` per draft token verified (every draft's row
    sampled and read back); 1 and 8 chunks of 9 tokens at 3,072 as prefill chunks and as
    verifies, as `--verify-drafts 8` beside `--prefill-context-lens 3072` measures them."""
    pts, times = [], []
    for d in (0, 1, 8, 32):
        for p in (0, 8, 64, 96, 512):
            for per_seq in (1024, 3072):
                if d + p:
                    ctx = d * per_seq + p
                    pts.append((d, p, ctx, 1 if p else 0, 0, 0))
                    times.append(_closed_form_ms(d, p, ctx))
        for k in (1, 8):  # the same chunks as prefill chunks, then as verifies
            p, s = 9 * k, 3072
            ctx = d * 3072 + p + k * s
            pts.append((d, p, ctx, k, s, 0))
            times.append(_closed_form_ms(d, p, ctx))
            pts.append((d, p, ctx, k, s, 8 * k))
            times.append(_closed_form_ms(d, p, ctx) + per_draft_ms * 8 * k)
    return ProfileCost(np.array(pts, dtype=np.float64), np.array(times) / 1e3)


def test_verify_points_fit_a_term_per_draft_and_the_simulator_charges_it():
    cost = _verify_profile(0.05)
    assert cost.measures_verifies
    assert cost.describe()["coef"]["l_s_per_draft_token"] * 1e3 == pytest.approx(0.05, rel=0.05)
    chunks = [(9, 3100)] * 4
    verify = cost.step_time(20, 36, 24 * 3100 + 36, chunks, num_draft_tokens=32)
    prefill = cost.step_time(20, 36, 24 * 3100 + 36, chunks)
    assert (verify - prefill) * 1e3 == pytest.approx(32 * 0.05, rel=0.1)
    # the simulator names the drafts, and charges no stand-in launch on top of a measured verify
    reqs = synthetic_edit_requests(4, 256, 96, 1.0, seed=3)
    sched = SchedulerConfig(max_model_len=4096, num_blocks=4096, max_num_seqs=16,
                            max_num_batched_tokens=2048, block_size=16, enable_prefix_caching=True)
    with_term = simulate_speculation(reqs, cost, sched, SpeculationConfig(), OracleAcceptance(),
                                     concurrency=4, async_scheduling=True)
    without = simulate_speculation(reqs, _verify_profile(0.0), sched, SpeculationConfig(),
                                   OracleAcceptance(), concurrency=4, async_scheduling=True)
    drafts = sum(s[3] for s in with_term.steps)
    assert drafts > 50 and sum(s[3] for s in without.steps) == drafts
    assert with_term.makespan - without.makespan == pytest.approx(drafts * 0.05e-3, rel=0.1)
