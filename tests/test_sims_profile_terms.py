"""`sim run / sweep / search / slo / window / agent --profile` charge a profile as the engine that measured it runs
(`sims.profile_terms`, `--profile-terms auto`): the terms `sim validate` scores, read from the
profile alone. Before session 26 they charged the bare profile, with no prefill cap on a CUDA
profile unless given, a model no validation had scored."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.simulator.validate import length_spec
from scheduler.capacity import CUDA_PREFILL_CAP_TOKENS
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.profile_cost import plan_leads
from sims.profile_terms import engine_terms
from sims.report import summarize
from sims.runner import simulate_spec

ROOT = Path(__file__).resolve().parents[1]
PART = ROOT / "bench/results/fidelity_grid_h200_s25/6.7b-mixed-seeds"
PROFILE = PART / "profile_6.7b-mixed-seeds.json"


def spec(*argv):
    p = argparse.ArgumentParser()
    add_run_args(p)
    return spec_from_args(parse_with_config(p, list(argv)))


def test_a_cuda_profile_gets_the_engines_terms():
    doc = json.loads(PROFILE.read_text())
    terms = engine_terms(doc)
    leads = plan_leads(doc)
    assert terms == {"cost": {"power_cap": True, "cap_by_power": True, "hide_launch": True},
                     "engine": {"async_plan_lead_s": leads["decode_only_s"],
                                "async_plan_lead_prefill_s": leads["with_prefill_s"]},
                     "device": "cuda"}
    s = spec("--profile", str(PROFILE))
    assert (s.cost.hide_launch, s.cost.power_cap, s.cost.cap_by_power) == (True, True, True)
    assert s.engine.async_plan_lead_s == leads["decode_only_s"] > 0
    assert s.engine.async_plan_lead_prefill_s == leads["with_prefill_s"] > leads["decode_only_s"]
    # the CUDA engine's prefill cap while decoding, which the simulator does not default to
    assert s.scheduler.prefill_cap.max_tokens == CUDA_PREFILL_CAP_TOKENS
    # a flag still wins
    assert spec("--profile", str(PROFILE), "--max-prefill-tokens-while-decoding", "512"
                ).scheduler.prefill_cap.max_tokens == 512
    bare = spec("--profile", str(PROFILE), "--profile-terms", "off")
    assert (bare.cost.hide_launch, bare.cost.power_cap, bare.cost.cap_by_power) == (False, False, False)
    assert bare.engine.async_plan_lead_s is None and bare.scheduler.prefill_cap.max_tokens != CUDA_PREFILL_CAP_TOKENS


def test_a_cpu_profile_has_nothing_to_hide(tmp_path):
    doc = {"format": "tidegate-profile/1", "device": "cpu", "block_size": 16, "num_kv_blocks": 100,
           "points": [{"num_decode_seqs": d, "num_prefill_tokens": p, "num_context_tokens": d * 64 + p,
                       "step_ms": 1 + 0.1 * d + 0.01 * p, "launch_ms_median": 0.2}
                      for d, p in ((1, 0), (4, 0), (0, 64), (2, 32), (8, 0))]}
    assert engine_terms(doc) == {"cost": {"power_cap": False}, "engine": {}, "device": "cpu"}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(doc))
    s = spec("--profile", str(path))
    assert (s.cost.hide_launch, s.cost.power_cap) == (False, False) and s.engine.async_plan_lead_s is None
    with pytest.raises(ValueError, match="--profile"):
        spec("--profile", str(tmp_path / "missing.json"))


def test_the_engines_terms_predict_the_live_decode():
    """Session 25's H200 6.7B mixed-lengths part, seed 0 at 0.8x (18.4 req/s): `sim run`'s spec at
    the live run's settings and lengths. With the engine's terms its TPOT P50 is within 5 % of live;
    the bare profile with the same prefill cap charged every step its launch and no async overlap,
    over 10 % slow."""
    v = json.loads((PART / "validate_6.7b-mixed-seeds.json").read_text())
    load = next(x for x in v["loads"] if x["load_label"] == "0.8x")
    run = next(r for r in load["runs"] if r["seed"] == 0)
    cfg, lb = v["config"], v["live_backend"]
    argv = ["--profile", str(PROFILE), "--rate", str(load["rate"]), "--num-requests", str(cfg["num_requests"]),
            "--seed", "0", "--max-num-seqs", "256", "--max-num-batched-tokens", "2048",
            "--num-blocks", str(lb["num_kv_blocks"]), "--max-model-len", str(lb["max_model_len"]),
            "--prefix-caching", "on", "--max-prefill-tokens-while-decoding", "256"]

    def tpot_err(*extra):
        s = spec(*argv, *extra)
        # the live run's lengths: the validate caps the lognormal draws at 4x their mean
        s = replace(s, workload=replace(s.workload, input_len=length_spec(cfg["input_len"]),
                                        output_len=length_spec(cfg["output_len"])))
        return summarize(simulate_spec(s))["tpot_ms"]["p50"] / run["live"]["tpot_ms"]["p50"] - 1

    assert abs(tpot_err()) < 0.05
    assert tpot_err("--profile-terms", "off") > 0.10
