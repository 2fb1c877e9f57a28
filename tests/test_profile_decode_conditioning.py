"""Issue 35, session 32: every decode-only point is measured after the grid's paused mixed step.

The grid's decode points each follow the grid's paused mixed points; the decode-bucket and spread
points came one decode shape after another. On one H100 that alone read them 1-1.7 % under the same
shapes after a mixed step (bench/results/decode_same_machine_s32), and the live steps they priced ran
1.8 % over the model. So a decode-only point right after another decode-only point first runs the
mixed step beside its decodes (`condition_decode_point`), and the profile says how many did."""
from __future__ import annotations

import json
import types

import torch

from bench.engine import profile
from gateway.tidegate_cli import main as tidegate

GRID = ["--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "64", "--max-model-len", "256",
        "--decode-batch-sizes", "0,1,2,4", "--prefill-tokens", "0,16,32", "--context-lens", "16,100",
        "--packed-prefill-seqs", "", "--repeats", "1", "--warmup", "0"]


def _decode_only(p: dict) -> bool:
    return bool(p["num_decode_seqs"]) and not p["num_prefill_tokens"]


def test_a_decode_point_after_a_decode_point_runs_the_mixed_step_first(tmp_path, monkeypatch):
    calls = []
    real = profile.condition_decode_point

    def spy(runner, d, c, prefill_tokens, cfg, vocab, pause_s):
        calls.append((d, c))
        return real(runner, d, c, prefill_tokens, cfg, vocab, pause_s)

    monkeypatch.setattr(profile, "condition_decode_point", spy)
    out = tmp_path / "profile.json"
    assert tidegate(["backend", "profile", *GRID, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    pts = doc["points"]
    # exactly the decode-only points whose point before was decode-only too (the points keep the
    # jobs' order): here the spread points, one after another; the grid's follow its mixed points
    want = [(p["num_decode_seqs"], p["context_len"]) for i, p in enumerate(pts)
            if i and _decode_only(p) and _decode_only(pts[i - 1])]
    assert want and calls == want
    assert all("decode_spread" in p for i, p in enumerate(pts)
               if i and _decode_only(p) and _decode_only(pts[i - 1]))
    assert doc["decode_conditioning"] == {"points": len(want), "repeats": profile.CONDITION_REPEATS,
                                          "pause_ms": 0.0}

    calls.clear()
    off = tmp_path / "off.json"
    assert tidegate(["backend", "profile", *GRID, "--decode-conditioning", "off", "--out", str(off)]) == 0
    assert calls == [] and "decode_conditioning" not in json.loads(off.read_text())


def test_the_conditioning_runs_the_largest_fitting_mixed_step_paused(monkeypatch):
    launched, slept = [], []
    runner = types.SimpleNamespace(device=torch.device("cpu"), launch=lambda chunks: launched.append(chunks),
                                   finish=lambda step: None)
    monkeypatch.setattr(profile.time, "sleep", lambda s: slept.append(s))
    cfg = types.SimpleNamespace(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                block_size=16, num_blocks=64)
    assert profile.condition_decode_point(runner, 4, 100, [0, 16, 32, 64], cfg, 100, 0.06) == 1
    assert len(launched) == profile.CONDITION_REPEATS and slept == [0.06] * profile.CONDITION_REPEATS
    step = launched[0]
    decodes = [c for c in step if len(c.token_ids) == 1 and c.start_pos == 99]
    prefill = [c for c in step if c not in decodes]
    assert len(decodes) == 4 and len(prefill) == 1
    assert len(prefill[0].token_ids) == 32        # 64 does not fit beside 4 decodes in 64 tokens
    launched.clear()
    # no prefill fits beside a batch that fills the budget, or none in the grid: nothing runs
    assert profile.condition_decode_point(runner, 64, 100, [16, 32], cfg, 100, 0.06) == 0
    assert profile.condition_decode_point(runner, 4, 100, [0], cfg, 100, 0.06) == 0
    assert launched == []
