"""The soak's CI form (issue 13): two minutes of bench/reliability/soak.py's mixed load (HTTP streams,
plain requests, client drops, 400s, ZMQ generate and abort) through `tidegate serve`. Once the
load stops the gateway must be back where it started: the same asyncio tasks and file
descriptors, no front-door request open, every backend KV block free; and its memory must not
have grown over the run. The 30-minute run and its plot: RELIABILITY.md."""
from __future__ import annotations


def load_script():
    from bench.reliability import soak

    return soak


async def test_two_minute_soak_leaves_nothing_behind():
    s = await load_script().run_soak(minutes=2, interval_s=10, out=None)
    base, final = s["baseline"], s["final_idle"]
    print(s["requests"], final)
    assert s["samples"] >= 10 and sum(s["requests"].values()) > 200
    assert s["requests"].get("dropped", 0) > 0 and s["requests"].get("zmq-abort", 0) > 0
    assert final["gateway_tasks"] == base["gateway_tasks"]
    assert final["gateway_fds"] <= base["gateway_fds"] + 2
    assert final["frontdoor_open"] == 0
    assert final["b0_kv_usage"] == 0 and final["b1_kv_usage"] == 0
    rss = s["drift"]["gateway_rss_mib"]
    assert rss["last"] - rss["first"] < 16, rss
