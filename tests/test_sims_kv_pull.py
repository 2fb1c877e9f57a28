"""Prefix pull in the simulator (issue 34): the gateway's planner and the backends' own block
managers, the transfer as a delivery delay. A request spilled off its prefix's holder pulls the
prefix instead of recomputing it: more of the prompt tokens hit, every request finishes, and
the pools' books balance."""
from dataclasses import replace

import numpy as np

from scheduler.kv_cost import KVCostModel, KVRates, PullConfig, PullPlanner
from scheduler.placement import PlacementConfig
from scheduler.prefix_index import PrefixIndex
from sims.event_loop import EventLoop
from sims.report import summarize
from sims.runner import CostSpec, RunSpec
from sims.workload import LengthSpec, WorkloadConfig, generate

PROFILE = "bench/results/kv_pull_cpu/tiny_cpu_profile.json"  # tiny on this repo's CPU box


def _run(pull: PullConfig | None, rate: float = 80.0):
    """4 tiny CPU backends (the measured profile), 8 tenants of 1,024-token prefixes."""
    wl = WorkloadConfig(num_requests=400, input_len=LengthSpec("fixed", 1024 + 64),
                        output_len=LengthSpec("fixed", 16), shared_prefix_fraction=1.0,
                        shared_prefix_len=1024, num_prefix_groups=8, seed=0, rate=rate)
    spec = RunSpec(cost=CostSpec(model="tiny", profile=PROFILE), workload=wl)
    engine = replace(spec.engine, num_backends=4, kv_pull=pull,
                     placement=PlacementConfig(policy="prefix"))
    loop = EventLoop(generate(wl), spec.cost.build(), spec.scheduler, engine)
    result = loop.run()
    for be in loop.backends:  # the pools' books balance, pulled blocks included
        be.sched.bm.check_integrity()
        assert be.sched.bm.num_used_blocks == 0
    return result, summarize(result, slo_ttft_ms=1000, slo_tpot_ms=100)


def test_spilled_requests_pull_instead_of_recomputing():
    pull = PullConfig(default_rates=KVRates(bytes_per_token=2048, link_bytes_per_s=1e9))
    # 100 req/s: ProfileCost's mixed-step model (b19ee65) made this profile's steps cheaper, and
    # 80 req/s no longer loads four backends (no pull 0.978 there)
    (off, roff), (on, ron) = _run(None, 100.0), _run(pull, 100.0)
    stats = on.extra["kv_pull"]
    assert stats["pulls"] >= 5 and stats["pulled_tokens"] >= 0.9 * 1024 * stats["pulls"]
    assert "kv_pull" not in off.extra
    for r in (off, on):
        assert np.isfinite(r.finish_time).all() and not r.rejected.any()  # every one finished
    assert ron["kv"]["prefix_hit_rate"] > roff["kv"]["prefix_hit_rate"] + 0.02
    assert ron["goodput_fraction"] > roff["goodput_fraction"] + 0.1  # 0.81 -> 1.0 measured


def test_planner_weighs_transfer_against_recompute():
    idx = PrefixIndex()
    for b in (0, 1):
        idx.add_backend(b)
    prefix = (11, 12, 13, 14)           # depths 1, 2, 4, 8 blocks
    idx.report(1, prefix, now=0.0)      # backend 1 holds all of it
    idx.report(0, prefix[:1], now=0.0)  # backend 0 the first block
    planner = PullPlanner(PullConfig(min_tokens=16), block_size=16)
    fast = KVRates(bytes_per_token=1000, prefill_tokens_per_s=1e4, link_bytes_per_s=1e9, layout="L")
    for b in (0, 1):
        planner.set_rates(b, fast)
    plan = planner.plan(idx, prefix, 0, 200, now=1.0)
    assert plan.peer == 1 and plan.num_tokens == 8 * 16 - 16
    assert plan.pull_s < 0.8 * plan.recompute_s
    # the peer is busy for 50 ms: recomputing 112 tokens (11 ms) wins
    assert planner.plan(idx, prefix, 0, 200, now=1.0, peer_wait_s=lambda p: 0.05) is None
    # backends that serve and land pulls off their step loops (kv_serve): no step to wait for
    for b in (0, 1):
        planner.set_rates(b, replace(fast, off_loop=True))
    assert planner.plan(idx, prefix, 0, 200, now=1.0, peer_wait_s=lambda p: 0.05).peer == 1
    planner.set_rates(0, fast)  # a receiver that reads the reply between its own steps
    assert planner.plan(idx, prefix, 0, 200, now=1.0, peer_wait_s=lambda p: 0.05) is None
    planner.set_rates(1, fast)
    # another layout is no peer
    planner.set_rates(1, replace(fast, layout="other"))
    assert planner.plan(idx, prefix, 0, 200, now=1.0) is None
    # a guess made at `now` (the request just placed there) is not a holder yet
    planner.set_rates(1, fast)
    idx2 = PrefixIndex()
    for b in (0, 1):
        idx2.add_backend(b)
    idx2.guess(1, prefix, now=5.0)
    assert planner.plan(idx2, prefix, 0, 200, now=5.0) is None
    assert planner.plan(idx2, prefix, 0, 200, now=5.1).peer == 1


def test_cost_model_numbers():
    m = KVCostModel(KVRates(bytes_per_token=1e6, prefill_tokens_per_s=1e4, link_bytes_per_s=1e10,
                            copy_bytes_per_s=5e10), PullConfig(fixed_s=0.001))
    # 16K tokens of 1 MB: 1.6 s over the link, 2 x 0.32 s of copies, 1 ms fixed; recompute 1.6 s
    assert abs(m.pull_s(16384) - (0.001 + 1.6384 + 2 * 0.32768)) < 1e-9
    assert abs(m.recompute_s(16384) - 1.6384) < 1e-9
    assert not m.should_pull(16384)
    assert m.should_split(8192) is False   # moving costs more than the prefill


def test_disaggregated_slow_prefill_in_the_simulator():
    """33B on the H200 (roofline), 512/128 streams at 4 req/s + 8K Slow prompts at 0.5 req/s:
    with a prefill backend and a fast link the long prompts are split off and the streams' tail
    ITL falls; with a 2 GB/s link moving 2 GB of KV costs more than half the prefill: no split."""
    from sims.kv_pull_study import main as study

    def run(link_gbps: float) -> list[dict]:
        import json
        import tempfile
        with tempfile.NamedTemporaryFile("r", suffix=".json") as fh:
            study(["split", "--num-requests", "120", "--link-gbps", str(link_gbps),
                   "--json", fh.name])
            return json.load(open(fh.name))["runs"]

    one, split = run(400)
    assert split["kv_pull"]["split"] >= 5 and split["kv_pull"]["prefill_backends"] == 1
    assert split["itl_ms"]["p99"] < 0.75 * one["itl_ms"]["p99"]
    one, kept = run(2)
    assert kept["kv_pull"]["split"] == 0 and kept["itl_ms"] == one["itl_ms"]


def test_split_streams_too_meets_the_tail_goal_in_the_simulator():
    """The same load: splitting the long prompts alone leaves the streams' own 512-token
    prefills on the decode backend (ITL p99/p50 > 1.5, issue 34's goal); with the streams split
    too (`--split-min-tokens 512`: they are Slow class by their 128 tokens out, `--split-margin
    3`) and the decode backend's prefill cap at 128 while it decodes, the tail is <= 1.5 p50."""
    import json
    import tempfile

    from sims.kv_pull_study import main as study

    def run(*flags: str) -> dict:
        with tempfile.NamedTemporaryFile("r", suffix=".json") as fh:
            study(["split", "--modes", "split", "--num-requests", "400", "--link-gbps", "400",
                   "--json", fh.name, *flags])
            return json.load(open(fh.name))["runs"][0]

    long_only = run()
    assert long_only["itl_p99_over_p50"] > 1.5
    both = run("--split-min-tokens", "512", "--split-margin", "3", "--prefill-cap", "128")
    assert both["kv_pull"]["split"] > 5 * long_only["kv_pull"]["split"]  # the streams too
    assert both["itl_p99_over_p50"] <= 1.5
    assert both["stream_ttft_ms"]["p99"] < 1000


def test_shared_gpu_slows_the_decode_steps_while_a_prefill_runs():
    """--shared-gpu K: the prefill and decode backends time-share one GPU; at K = 2 the decode
    backend's steps take twice as long while the prefill backend runs (8K prompts at 0.5 req/s:
    most of the time), so the streams' ITL p50 rises ~2x, and the long prompts wait longer."""
    import json
    import tempfile

    from sims.kv_pull_study import main as study

    def run(k: str) -> dict:
        with tempfile.NamedTemporaryFile("r", suffix=".json") as fh:
            study(["split", "--modes", "split", "--num-requests", "200", "--link-gbps", "400",
                   "--prefill-cap", "128", "--split-margin", "100", "--shared-gpu", k,
                   "--json", fh.name])
            return json.load(open(fh.name))["runs"][0]

    alone, shared = run("1"), run("2")
    assert shared["kv_pull"]["split"] == alone["kv_pull"]["split"] > 0
    assert shared["itl_ms"]["p50"] > 1.5 * alone["itl_ms"]["p50"]
    assert shared["slow_ttft_ms"]["p50"] > 1.5 * alone["slow_ttft_ms"]["p50"]
