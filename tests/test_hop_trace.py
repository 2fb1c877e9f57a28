"""bench.serving.hop_trace's matching of per-process stamps to client requests (pure functions)."""
from __future__ import annotations

from bench.serving.hop_trace import HOPS, match, report

INNER = HOPS[1:-1]


def _request(t0: int, step: int = 10) -> tuple[tuple[int, int], list[tuple[str, int]]]:
    events = [(hop, t0 + step * (i + 1)) for i, hop in enumerate(INNER)]
    return (t0, t0 + step * (len(INNER) + 1)), events


def test_each_request_gets_its_own_stamps_in_path_order():
    client, events = [], []
    for t0 in (1000, 2000, 3000):
        span, ev = _request(t0, step=10 + t0 // 1000)
        client.append(span)
        events += ev
    # stamps outside any request (a load report's pool_in, a Hello) are ignored
    events += [("pool_in", 1500), ("backend_in", 2500)]
    rows = match(client, events[::-1])  # the order of the files does not matter
    assert [r["client_send"] for r in rows] == [1000, 2000, 3000]
    for r, step in zip(rows, (11, 12, 13)):
        times = [r[h] for h in HOPS]
        assert times == [r["client_send"] + step * i for i in range(len(HOPS))]
    rep = report(rows)
    assert rep["requests"] == 3
    assert rep["hops_us"]["door_in -> to_backend"]["p50"] == 12 / 1000
    assert rep["total_us"]["max"] == 13 * (len(HOPS) - 1) / 1000


def test_a_request_missing_a_stamp_is_dropped_not_matched_to_the_next_ones():
    (s1, ev1), (s2, ev2) = _request(1000), _request(2000)
    ev1 = [e for e in ev1 if e[0] != "to_client"]  # its last stamp is lost
    rows = match([s1, s2], ev1 + ev2)
    assert [r["client_send"] for r in rows] == [2000]
    assert rows[0]["to_client"] == dict(ev2)["to_client"]
