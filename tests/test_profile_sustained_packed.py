"""Issue 35, session 18 (H35P): the pause check's "sustained_packed" run on the CPU.

The run times the grid's largest prefill-only step (the most tokens, of those the most prompts)
paused, then traces it back to back as "sustained_mixed"; a grid without a prefill-only point
larger than the check's step skips it and says why. `ProfileCost(cap_by_power=True)` reads it."""
import json
import statistics

import pytest

from backend.engine.args import int_list
from bench.engine import profile
from bench.simulator.validate import profile_grid
from gateway.tidegate_cli import main as tidegate


def test_the_packed_shape_is_the_grids_largest_prefill_only_step_of_the_most_prompts():
    # the validate's grid (512-token prompts, the CUDA engine's 256-token cap, k 2 and 4 packed)
    g = {k: int_list(v) for k, v in profile_grid(512, 128, prefill_cap_tokens=256).items()}
    shapes = profile.step_shapes(g["decode_batch_sizes"], g["prefill_tokens"], g["context_lens"], [2, 4],
                                 g["prefill_context_lens"], None, max_num_seqs=256,
                                 max_num_batched_tokens=2048, max_model_len=16384)
    assert profile.packed_check_shape(shapes, 512) == (0, 2048, 0, 4, 0)
    # a cached-prefix point of more tokens is not prefill-only from position 0; decodes are not either
    assert profile.packed_check_shape([(0, 512, 0, 1, 0), (0, 1024, 0, 1, 256), (8, 1024, 100, 2, 0)], 512) is None
    assert profile.packed_check_shape([(0, 512, 0, 1, 0), (0, 1024, 0, 1, 0), (0, 1024, 0, 2, 0)], 512) == (
        0, 1024, 0, 2, 0)
    # only the check's own step, or packed steps of its tokens: nothing larger to sustain
    assert profile.packed_check_shape([(0, 512, 0, 1, 0), (0, 512, 0, 4, 0)], 512) is None


def _profile(tmp_path, monkeypatch, prefill_tokens, check_tokens=None):
    slept = []
    monkeypatch.setattr(profile.time, "sleep", lambda s: slept.append(s))
    monkeypatch.setattr(profile, "SUSTAIN_S", 0.05)
    if check_tokens is not None:
        monkeypatch.setattr(profile, "PAUSE_CHECK_TOKENS", check_tokens)
    out = tmp_path / "profile.json"
    rc = tidegate(["backend", "profile", "--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8",
                   "--max-num-batched-tokens", "64", "--max-model-len", "256",
                   "--decode-batch-sizes", "0,1", "--prefill-tokens", prefill_tokens, "--context-lens", "16",
                   "--packed-prefill-seqs", "2", "--repeats", "2", "--warmup", "1",
                   "--pause-ms", "40", "--out", str(out)])
    assert rc == 0
    return json.loads(out.read_text()), slept


@pytest.mark.filterwarnings("ignore:profile. residual interpolation disabled")
def test_the_pause_check_sustains_the_largest_packed_step(tmp_path, monkeypatch):
    # the check's step is the 32-token prefill (PAUSE_CHECK_TOKENS 32 here, 512 on the H200); the
    # grid's largest prefill-only step is 64 tokens in 2 prompts (k 2 over k 1 at 64)
    doc, slept = _profile(tmp_path, monkeypatch, "0,32,64", check_tokens=32)
    check = doc["pause_check"]
    assert check["num_prefill_tokens"] == 32 and "sustained_packed_skipped" not in check
    assert [r["run"] for r in check["runs"]] == ["paused", "back_to_back", "paused_again", "after_decode",
                                                 "sustained", "sustained_mixed", "mixed_pattern_1",
                                                 "mixed_pattern_3", "sustained_packed"]
    run = check["runs"][-1]
    assert (run["num_decode_seqs"], run["num_prefill_tokens"], run["num_prefill_seqs"],
            run["decode_context_len"]) == (0, 64, 2, 0)
    # paused: 1 warm-up + 10 repetitions, each after the check's pause; then SUSTAIN_IDLE_S idle and
    # the trace (no sleep), its last 10 steps the back-to-back figures (no repetitions after it)
    assert slept[-12:] == [0.04] * 11 + [profile.SUSTAIN_IDLE_S]
    assert run["paused_ms_median"] > 0 and run["paused_pause_ms"] == 40.0 and run["pause_ms"] == 0.0
    assert run["sustain_ms"] == 50.0 and len(run["trace_ms"]) == len(run["trace_t_ms"]) == run["sustain_steps"] >= 1
    tail = run["trace_ms"][-10:]
    assert run["step_ms_median"] == statistics.median(tail)
    assert (run["step_ms_min"], run["step_ms_max"]) == (min(tail), max(tail))
    # the cost model reads it (whatever the CPU's ratio: a CPU does not throttle by power)
    from sims.profile_cost import ProfileCost
    path = tmp_path / "profile.json"
    cost = ProfileCost.from_json(path, hide_launch=True, power_cap=True, cap_by_power=True)
    assert cost.step_time(0, 64, 64, [32, 32]) > 0
    if cost.cap_packed is not None:
        assert cost.cap_packed["num_prefill_tokens"] == 64 and cost.cap_packed["num_prefill_seqs"] == 2


def test_a_grid_without_a_larger_prefill_step_skips_the_run_and_says_why(tmp_path, monkeypatch):
    doc, _ = _profile(tmp_path, monkeypatch, "0,32")  # the check's step (32) is the largest
    check = doc["pause_check"]
    assert "sustained_packed" not in [r["run"] for r in check["runs"]]
    assert check["sustained_packed_skipped"] == "no prefill-only point of more than the check's 32 tokens in the grid"
