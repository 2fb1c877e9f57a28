"""Chaos under load (issue 13), CI form of bench/reliability/chaos.py: 64 streams through `tidegate
serve` over three echo backends while one is killed with SIGKILL (then restarted) and another
is frozen with SIGSTOP for 3 s. Every request ends exactly once (its finish or a clear error),
no request is lost, the survivors hold no KV block afterwards, and the restarted backend rejoins
(healthy, reporting its own empty pool) and serves a burst."""
from __future__ import annotations


def load_script():
    from bench.reliability import chaos

    return chaos


async def test_every_request_is_answered_once_through_kills_freezes_and_a_restart():
    result = await load_script().run_chaos(streams=64)
    print(result)
    assert result["requests"] >= 64
    assert result["lost"] == 0 and result["answered_twice"] == 0
    assert result["finished"] + sum(result["errors"].values()) == result["requests"]
    # failures are only the clear kind: a backend died under a request that had streamed
    assert set(result["errors"]) <= {"backend_down"}, result["errors"]
    assert all(v == 0.0 for v in result["kv_usage_after"].values()), result["kv_usage_after"]
    assert all(v == 1.0 for v in result["healthy_after"].values()), result["healthy_after"]
    after = result["after_restart"]
    assert after["finished"] == after["requests"] == 12
