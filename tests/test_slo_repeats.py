"""bench.serving.slo_repeats: the live Retry-After's ceiling from repeated runs of one schedule."""
import gzip
import json
import math

from bench.serving.slo_repeats import Probe, compatible, hit, load_live, main, repeat_scores


def _p(rep, i, ra, w, cls="slow", hist=()):
    return Probe(rep, i, cls, ra, w, hist)


def test_hit_and_compatible_are_the_goals_window():
    assert hit(1.25, 1.0) and hit(0.75, 1.0) and not hit(1.26, 1.0) and not hit(0.74, 1.0)
    # one Retry-After within +-25% of both: waits at most (1.25 / 0.75) = x1.67 apart
    assert compatible(0.3, 0.5) and not compatible(0.3, 0.51)
    assert hit(0.375, 0.3) and hit(0.375, 0.5)
    assert not compatible(0.0, 0.1)


def test_deterministic_repeats_reach_the_ceiling():
    # every repeat of a request waits the same: the other repeats' median hits every probe, no
    # pair is incompatible, and the bound is 1
    probes = [_p(f"r{k}", i, 0.1, 0.2 + 0.1 * i) for k in range(4) for i in range(3)]
    s = repeat_scores(probes, "slow")
    assert s["covered"] == 12 and s["loo_median_hit"] == 1.0
    assert s["pairs"] == 3 * 6 and s["incompatible"] == 0.0 and s["bound"] == 1.0
    assert s["rule_hit_all"] == 0.0 and s["spread_p90_over_p10_p50"] == 1.0


def test_a_request_whose_repeats_split_x3_caps_every_rule():
    # request 0 waits 0.2 s in half the repeats and 0.6 s in the others, from the same state
    # (the same Retry-After): 9 of 15 pairs cannot both be hit, so no rule of that state can
    # exceed sqrt(1 - 9/15) of the probes; the leave-one-out median falls between the two sides
    waits = [0.2, 0.2, 0.2, 0.6, 0.6, 0.6]
    probes = [_p(f"r{k}", 0, 0.25, w) for k, w in enumerate(waits)]
    s = repeat_scores(probes, "slow", ra_tol=0.05)
    assert s["pairs"] == 15 and math.isclose(s["incompatible"], 9 / 15)
    assert math.isclose(s["bound"], math.sqrt(6 / 15))
    # each held-out 0.2 sees the others' median (0.2+0.6)/2 = 0.4: a miss; same for 0.6
    assert s["loo_median_hit"] == 0.0
    # the rule (0.25 s) hits the three 0.2 s waits
    assert s["rule_hit_covered"] == 0.5
    # a rule that hits one side entirely reaches 0.5 <= the bound
    assert 0.5 <= s["bound"]


def test_state_matching_uses_the_retry_after_and_the_history():
    probes = [_p("a", 0, 1.0, 0.5, hist=((1, True, False),)),
              _p("b", 0, 1.02, 0.5, hist=((1, True, False),)),
              _p("c", 0, 2.0, 2.0, hist=((1, False, False),)),
              _p("c", 1, 2.0, 2.0)]  # another request of the same repeat: never a match
    assert repeat_scores(probes, "slow")["pairs"] == 3
    s = repeat_scores(probes, "slow", ra_tol=0.05)
    assert s["pairs"] == 1 and s["covered"] == 2 and s["incompatible"] == 0.0
    s = repeat_scores(probes, "slow", history=True)
    assert s["pairs"] == 1 and s["loo_median_hit"] == 1.0
    assert repeat_scores(probes, "normal")["probes"] == 0


def _write_run(path, rows):
    path.mkdir()
    with gzip.open(path / "records_a.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def test_load_live_reads_probed_refusals_and_their_history(tmp_path, capsys):
    def rec(i, t, err=None, ra=None, probe=None, cls="slow"):
        return {"i": i, "class": cls, "max_tokens": 60, "send_s": t, "error": err,
                "ttft_s": None if err else 0.03, "retry_after_s": ra, "probe_ttft_s": probe}
    _write_run(tmp_path / "r1", [rec(0, 0.0), rec(1, 0.5, "http_429", 0.4, None),
                                 rec(2, 1.2, "http_429", 0.5, 0.6)])
    _write_run(tmp_path / "r2", [rec(0, 0.0), rec(1, 0.5), rec(2, 1.2, "http_429", 0.5, 1.5)])
    probes = load_live([str(tmp_path / "r1"), str(tmp_path / "r2")], history_s=1.0)
    assert [(p.repeat, p.request, p.wait_s) for p in probes] == [("r1", 2, 0.6), ("r2", 2, 1.5)]
    # request 1 (0.7 s before) differs: refused in r1, admitted in r2
    assert probes[0].history == ((1, True, False),) and probes[1].history == ((1, False, False),)
    assert repeat_scores(probes, "slow", history=True)["pairs"] == 0
    s = repeat_scores(probes, "slow")
    assert s["pairs"] == 1 and s["incompatible"] == 1.0 and s["bound"] == 0.0
    assert main(["live", str(tmp_path / "r1"), str(tmp_path / "r2")]) == 0
    assert "| slow | same request | 2 (1) |" in capsys.readouterr().out
