"""Session affinity in placement (issue 30): a session stays on its backend while it has slack,
moves (counted) when not, a sub-agent follows its parent's KV, a session is found from the
prompt alone, sessions sharing one system prompt spread, and a pin holder is preferred."""
from scheduler.placement import PlacementConfig, PlacementItem
from scheduler.placements import create_placement
from scheduler.sessions import SessionInfo, chain_hashes, sampled_prefix

BS = 16
SYS = list(range(100_000, 100_000 + 40 * BS))  # a system prompt past the sampled depths


def _policy(n=4, policy="prefix"):
    p = create_placement(PlacementConfig(policy=policy, block_size=BS, load_slack_tokens=4096,
                                         fixed_slack=True))
    for b in range(n):
        p.add_backend(b)
    return p


def _turns(sid, n, first=200, step=100):
    """A session's prompts: the system prompt, then its own history growing turn by turn."""
    own = [sid * 1_000_000 + k for k in range(first + step * n)]
    return [SYS + own[:first + step * t] for t in range(n)]


def _place(p, prompt, key=None, now=0.0, pin_blocks=0, pin_until=0.0, out=10):
    chain = chain_hashes(prompt, BS)
    s = SessionInfo(key, chain, pin_blocks, pin_until)
    it = PlacementItem(len(prompt) + out, sampled_prefix(chain), None, s)
    p.place([it], now)
    return it


def _finish(p, it):
    p.release(it.backend, it.charged)


def test_session_stays_put_and_sessions_spread_over_a_shared_system_prompt():
    p = _policy()
    sessions = {sid: _turns(sid, 5) for sid in range(8)}
    home = {}
    for t in range(5):
        for sid, turns in sessions.items():
            it = _place(p, turns[t], key=f"s{sid}", now=t)
            home.setdefault(sid, it.backend)
            assert it.backend == home[sid], f"session {sid} left its backend at turn {t}"
            _finish(p, it)
    assert sorted(home.values()) == [0, 0, 1, 1, 2, 2, 3, 3]  # not all behind one system prompt
    st = p.sessions.stats()
    assert st["session_moves"] == 0 and st["session_stays"] == 8 * 4


def test_session_found_from_the_prompt_alone():
    p = _policy()
    turns = _turns(7, 4)
    first = _place(p, turns[0])
    _finish(p, first)
    for t in range(1, 4):
        for other in range(3):  # other traffic in between
            _finish(p, _place(p, _turns(100 + 10 * t + other, 1)[0], now=t))
        it = _place(p, turns[t], now=t)
        assert it.backend == first.backend
        assert it.charged == len(turns[t]) + 10 - (len(turns[t - 1]) - 1) // BS * BS  # held KV
        _finish(p, it)
    assert p.sessions.num_from_prefix == 3


def test_session_moves_when_its_backend_has_no_slack_and_the_metric_says_so():
    p = _policy(2)
    turns = _turns(1, 3)
    it = _place(p, turns[0], key="a")
    _finish(p, it)
    home = it.backend
    p.charge(home, 50_000)  # its backend is busy with other work: past 1.25 x least + 4096
    it2 = _place(p, turns[1], key="a", now=1)
    assert it2.backend != home
    assert p.sessions.num_moves == 1
    _finish(p, it2)
    p.release(home, 50_000)
    it3 = _place(p, turns[2], key="a", now=2)  # its new home holds the longer prompt now
    assert it3.backend == it2.backend and p.sessions.num_moves == 1


def test_sub_agent_goes_where_its_parents_kv_is():
    p = _policy()
    parent = _turns(3, 2)
    it = _place(p, parent[0], key="parent")
    _finish(p, it)
    for k in range(6):  # unrelated sessions fill the other backends first
        _place(p, _turns(200 + k, 1)[0], key=f"x{k}")
    sub = parent[0] + list(range(900_000, 900_300))  # forked from the parent's context
    it_sub = _place(p, sub, key="sub-agent-1")
    assert it_sub.backend == it.backend


def test_pin_holder_preferred():
    p = _policy()
    prompt = SYS + list(range(5_000, 5_400))
    blocks = (len(SYS)) // BS
    it = _place(p, prompt, key=None, pin_blocks=blocks, pin_until=100.0)
    _finish(p, it)
    for k in range(4):  # other sessions with the same system prompt: the pin holder has it
        other = SYS + list(range(60_000 + 1000 * k, 60_000 + 1000 * k + 300))
        o = _place(p, other, key=f"o{k}", now=1.0)
        assert o.backend == it.backend
        _finish(p, o)
    assert p.sessions.num_pin_hits == 4
    o = _place(p, SYS + list(range(70_000, 70_300)), key="late", now=101.0)  # the pin expired
    assert p.sessions.num_pin_hits == 4


def test_least_tokens_ignores_sessions():
    p = _policy(policy="least-tokens")
    turns = _turns(1, 2)
    a = _place(p, turns[0], key="a")
    b = _place(p, turns[1], key="a")
    assert a.backend != b.backend  # a was not finished: least tokens goes elsewhere
