"""The live agent replay's figures (bench.serving.agent_replay.summarize) on hand-made records:
reuse from per-request cached tokens, follow-ups judged only when sent after their predecessor
ended and within its pin's TTL, evictions of pinned vs unpinned prefixes."""
from bench.serving.agent_replay import summarize
from sims import agent_trace as at


def _req(t, session, own, turn, pin=0, ttl=0.0):
    return at.AgentRequest(t, session, None, turn, [("sys", 0, 64), (session, 0, own)], 4, pin, ttl)


def test_summary_counts_pins_and_reuse():
    reqs = [_req(0, "a", 64, 0, pin=128, ttl=10.0), _req(1, "b", 64, 0),
            _req(5, "a", 96, 1), _req(6, "b", 96, 1),
            _req(7, "a", 128, 2), _req(30, "a", 160, 3)]
    tr = at.AgentTrace(reqs)
    recs = [{"sent": 0, "first": 0.1, "end": 1, "cached": 0, "pin": "pinned"},
            {"sent": 1, "first": 1.1, "end": 2, "cached": 64},
            {"sent": 5, "first": 5.1, "end": 6, "cached": 112},     # kept: 127 // 16 * 16 = 112
            {"sent": 6, "first": 6.1, "end": 7, "cached": 64},      # b's prefix gone: a miss
            {"sent": 5.5, "first": 7.1, "end": 8, "cached": 0},     # sent before its turn ended
            {"sent": 30, "first": 30.1, "end": 31, "cached": 0}]    # unpinned predecessor: a miss
    out = summarize(tr, recs, {}, {}, [], 0.0, 16)
    assert out["pins"]["followups_of_pinned_within_ttl"] == 1
    assert out["pins"]["pinned_prefix_evicted"] == 0
    assert out["pins"]["followups_of_unpinned"] == 2 and out["pins"]["unpinned_prefix_missed"] == 2
    avail = sum(at.available_reuse(tr))
    assert out["reuse_captured"] == (0 + 64 + 112 + 64 + 0 + 0) / avail
    assert out["finished"] == 6 and abs(out["ttft_p50_ms_first"] - 100.0) < 1e-6
