"""Issue 35 (the H200 grid's 6.7B part): the profile `sim validate` measures covers the steps a
capped CUDA engine runs — prefill chunks of the cap (256) beside the decodes, a small chunk, and
chunks from a cached prefix at the cap's position. Without them the cost model interpolated a
256-token chunk step between the decode-only step and a 512-token chunk, and on the H200's 6.7B
those steps were charged 0.84-0.90 of their live time."""
import argparse
import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from bench.simulator import validate
from sims.profile_cost import ProfileCost


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def test_the_grid_measures_the_engines_prefill_chunks():
    g = validate.profile_grid(512, 128, prefill_cap_tokens=256)
    assert _ints(g["prefill_tokens"]) == [0, 64, 256, 512, 1024, 2048]
    assert _ints(g["prefill_context_lens"]) == [256]
    assert g["decode_batch_sizes"] == "0,1,2,4,8,16,32,64,128" and g["context_lens"] == "512,576,640"
    # no cap (the CPU engine), or prompts that fit in one capped chunk: the grid as before
    for cap in (None, 0, 512, 1024):
        g = validate.profile_grid(512, 128, prefill_cap_tokens=cap)
        assert _ints(g["prefill_tokens"]) == [0, 512, 1024, 2048] and g["prefill_context_lens"] == ""


def test_ensure_profile_asks_the_profiler_for_them(tmp_path, monkeypatch):
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    a = argparse.Namespace(profile=str(tmp_path / "p.json"), reprofile=True, model="m", device="cuda",
                           input_len="512", output_len="128", profile_repeats=3, profile_warmup=1,
                           profile_pause_ms=None, decode_batch_sizes=None, prefill_tokens=None,
                           context_lens=None, engine_arg=[], quiet=True)
    validate.ensure_profile(a)
    cmd = seen[-1]
    assert cmd[cmd.index("--prefill-tokens") + 1] == "0,64,256,512,1024,2048"
    assert cmd[cmd.index("--prefill-context-lens") + 1] == "256"
    # the engine's cap turned off: the old grid
    validate.ensure_profile(argparse.Namespace(**{**vars(a), "engine_arg": ["--max-prefill-tokens-while-decoding=0"]}))
    cmd = seen[-1]
    assert cmd[cmd.index("--prefill-tokens") + 1] == "0,512,1024,2048"
    assert cmd[cmd.index("--prefill-context-lens") + 1] == ""
    # on the CPU (no cap) likewise
    validate.ensure_profile(argparse.Namespace(**{**vars(a), "device": "cpu"}))
    assert seen[-1][seen[-1].index("--prefill-tokens") + 1] == "0,512,1024,2048"
    # the device-timed repetitions: on by default, `--profile-device-time off` passed through (a
    # tight device call saves their time; session 17)
    assert cmd[cmd.index("--device-time") + 1] == "on"
    validate.ensure_profile(argparse.Namespace(**{**vars(a), "profile_device_time": "off"}))
    assert seen[-1][seen[-1].index("--device-time") + 1] == "off"
    assert validate.parser().parse_args([]).profile_device_time == "on"


def _law(d, p, c, s=0, k=1):
    """A step-time law with what the H200's 6.7B showed (live, 2026-12-04): a step with prefill
    tokens costs a constant over the decode-only step (the mixed graph: ~1.5 ms; a 256-token chunk
    beside one decode +5.2 ms, a 512-token one +8.9), its matrix products stream the weights (flat)
    up to a knee of ~64 tokens and are compute-bound past it; attention over the decodes' context,
    within the chunks and over a cached prefix."""
    t = 4.4e-3 + 1.5e-5 * d + 1.3e-7 * d * c
    if p:
        t += 1.5e-3 + 1.45e-5 * max(0, d + p - 64) + 2.0e-9 * p * p / k + 4.0e-9 * p * s
    return t


def _profile(grid: dict) -> ProfileCost:
    from bench.engine.profile import step_shapes
    shapes = step_shapes(_ints(grid["decode_batch_sizes"]), _ints(grid["prefill_tokens"]),
                         _ints(grid["context_lens"]), [2, 4], _ints(grid["prefill_context_lens"]), None,
                         max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=16384)
    pts, times = [], []
    for d, p, c, k, s in shapes:
        pts.append((d, p, d * c + p + k * s, k if p else 0, s))
        times.append(_law(d, p, c, s, max(k, 1)))
    return ProfileCost(np.array(pts, dtype=float), np.array(times))


def test_a_capped_chunk_is_charged_its_cost_only_with_the_new_grid():
    old = _profile(validate.profile_grid(512, 128))
    new = _profile(validate.profile_grid(512, 128, prefill_cap_tokens=256))
    c = 580
    r_old, r_new = [], []
    for d in (1, 12, 40):
        for s in (0, 256):  # a prompt's first and second 256-token chunk
            truth = _law(d, 256, c, s)
            ctx = d * c + 256 + s
            r_old.append(old.step_time(d, 256, ctx, [(256, s)]) / truth)
            r_new.append(new.step_time(d, 256, ctx, [(256, s)]) / truth)
    # the old grid (smallest chunk 512, none from a prefix) charges the capped chunks under
    # their law, the second chunk most; the new grid within 1% at every one
    assert min(r_old) < 0.95 and np.mean(r_old) < 0.975, r_old
    assert max(abs(r - 1) for r in r_new) < 0.01, r_new


def test_the_committed_6_7b_profile_lacks_them():
    """The committed 6.7B session's profile (the grid before the change): no 256-token point."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "bench/results/fidelity_grid_h200_s13/6.7b/profile_6.7b.json"
    if not path.is_file():
        pytest.skip("no committed 6.7B profile")
    doc = json.loads(path.read_text())
    assert sorted({p["num_prefill_tokens"] for p in doc["points"]}) == [0, 512, 1024, 2048]


# ---- decode-graph buckets: the profiler measures a decode-only point at each -------------------
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def test_the_profiler_measures_every_decode_bucket_inside_its_grid():
    from bench.engine.profile import decode_bucket_shapes, step_shapes
    g = validate.profile_grid(512, 128, prefill_cap_tokens=256)
    shapes = step_shapes(_ints(g["decode_batch_sizes"]), _ints(g["prefill_tokens"]), _ints(g["context_lens"]),
                         [2, 4], _ints(g["prefill_context_lens"]), None, max_num_seqs=256,
                         max_num_batched_tokens=2048, max_model_len=16384)
    extra = decode_bucket_shapes(shapes, BUCKETS, _ints(g["context_lens"]))
    assert extra == [(b, 0, c, 0, 0) for b in (24, 48, 96) for c in (512, 576, 640)]
    assert decode_bucket_shapes(shapes + extra, BUCKETS, [512, 576, 640]) == []


# ---- drawn lengths: the decode contexts span the workload's (issue 35, session 20) --------------

def test_drawn_lengths_take_a_short_and_a_long_context_beside_the_typical_prompt():
    from bench.engine.profile import spread_shapes
    # prompts lognormal median 512 sigma 0.8 (mean 705, 10th percentile 184, 90th 1,427), outputs
    # median 128 sigma 0.7 (90th 314): the grid's contexts 705, 184, 1,741 (was 705, 787, 869)
    got = validate.grid_context_lens("lognormal:512:0.8", "lognormal:128:0.7")
    assert got == [705, 184, 1741]
    assert validate.grid_context_lens("uniform:100:300", "64") == [200, 120, 344]
    assert validate.grid_context_lens("512", "128") is None  # fixed lengths: the grid as before
    g = validate.profile_grid(705, 164, prefill_cap_tokens=256, context_lens=got)
    assert g["context_lens"] == "705,184,1741"
    # and chunks from far into a long prompt: cached-prefix points at 1, 4 and 8 x the cap (session 28),
    # where the fixed lengths' grid keeps the cap's start alone
    assert g["prefill_context_lens"] == "256,1024,2048"
    assert validate.profile_grid(512, 128, prefill_cap_tokens=256)["prefill_context_lens"] == "256"
    # the spread points stay on the typical prompt (the first context), as sessions 19-20 measured them
    assert spread_shapes([2, 8], _ints(g["context_lens"]), max_num_seqs=256, max_num_batched_tokens=2048,
                         max_model_len=16384) == [(2, [[1, 705], [1, 2820]]), (8, [[7, 705], [1, 2820]])]
    # a quantile never passes the draws' cap (4 x the typical length)
    assert validate.length_quantile("lognormal:512:0.8", 0.9999) == 4 * 705


def test_ensure_profile_asks_for_the_drawn_lengths_contexts(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or SimpleNamespace(returncode=0, stdout="", stderr=""))
    a = argparse.Namespace(profile=str(tmp_path / "p.json"), reprofile=True, model="m", device="cuda",
                           input_len="lognormal:512:0.8", output_len="lognormal:128:0.7", profile_repeats=3,
                           profile_warmup=1, profile_pause_ms=None, decode_batch_sizes=None,
                           prefill_tokens=None, context_lens=None, engine_arg=[], quiet=True)
    validate.ensure_profile(a)
    assert seen[-1][seen[-1].index("--context-lens") + 1] == "705,184,1741"
    validate.ensure_profile(argparse.Namespace(**{**vars(a), "input_len": "512", "output_len": "128"}))
    assert seen[-1][seen[-1].index("--context-lens") + 1] == "512,576,640"
    # an explicit --context-lens wins
    validate.ensure_profile(argparse.Namespace(**{**vars(a), "context_lens": "100,200"}))
    assert seen[-1][seen[-1].index("--context-lens") + 1] == "100,200"
