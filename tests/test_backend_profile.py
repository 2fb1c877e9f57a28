import json

from gateway.tidegate_cli import main as tidegate


def main(argv):  # `tidegate backend profile ...`, the command users run
    return tidegate(["backend", *argv])


def test_profile_writes_the_documented_json(tmp_path):
    out = tmp_path / "profile.json"
    rc = main(["profile", "--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "64", "--max-model-len", "512",
               "--decode-batch-sizes", "0,1,4", "--prefill-tokens", "0,32", "--context-lens", "16,100",
               "--repeats", "1", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "tidegate-profile/1" and doc["num_kv_blocks"] == 64 and doc["block_size"] == 16
    pts = doc["points"]
    assert {(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in pts} == {
        (0, 32, 0), (1, 0, 16), (1, 32, 16), (4, 0, 16), (4, 32, 16), (1, 0, 100), (1, 32, 100),
        (4, 0, 100), (4, 32, 100),
        # the spread decode point (--decode-spread-points on): 3 decodes at 16, one at 64 (mean 28),
        # and the same beside one chunk of the mixed step (--mixed-spread-points on: 64 - 4 tokens)
        (4, 0, 28), (4, 60, 28)}
    for p in pts:
        ctx = sum(n * c for n, c in p.get("decode_context_lens", [[p["num_decode_seqs"], p["context_len"]]]))
        assert p["num_context_tokens"] == ctx + p["num_prefill_tokens"]
        assert p["step_ms"] > 0 and p["repeats"] == 1
    assert [p["decode_context_lens"] for p in pts if p.get("decode_spread") == "one_long"] == [[[3, 16], [1, 64]]] * 2
    # the off-edge points are off by default since session 35; the tile-edge pairs (--tile-edge-pairs on)
    # time the largest spread d (none reaches 8 here) on a tile edge (16 -> 128), past it and at the next
    # edge, alone and beside the mixed spread points' chunk, in rounds
    assert not any(p.get("decode_spread") == "off_edge" for p in pts)
    assert [(r["num_decode_seqs"], r["num_prefill_tokens"], r["on_context"], r["off_context"], r["next_context"],
             len(r["on_ms"]), len(r["next_ms"])) for r in doc["tile_edge_pairs"]] == [
        (4, 0, 128, 129, 256, 4, 4), (4, 60, 128, 129, 256, 4, 4)]
    from sims.profile_cost import ProfileCost

    model = ProfileCost.from_json(out)
    assert model.step_time(4, 0, 400) > 0 and model.num_kv_blocks(16) == 64
    assert doc["quantization"] == "none"
    # the async loop's plan lead per kind of step, from the points' launch times (sims.profile_cost.plan_leads)
    assert set(doc["plan_lead_ms"]) == {"decode_only", "with_prefill"}
    assert all(v >= 1.0 for v in doc["plan_lead_ms"].values())


def test_profile_takes_the_serving_weight_format(tmp_path, capsys):
    # `sim validate --engine-arg=--quantization=fp8` hands the flag to the profile as well as to
    # the live backend: the profile must measure the FP8 engine, not reject the flag (an H200 call
    # was lost to "unrecognized arguments"); on the CPU fp8 is refused in one line
    assert main(["profile", "--model", "tiny", "--quantization", "fp8",
                 "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fp8 quantization needs a CUDA GPU" in err
    assert not (tmp_path / "x.json").exists()


def test_profile_error_is_one_line(tmp_path, capsys):
    assert main(["profile", "--model", "nope", "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a directory nor a preset" in err


def test_profile_pause_idles_before_prefill_steps_only(tmp_path, monkeypatch):
    """--pause-ms sleeps before each repetition of a step with prefill tokens (the serving loop
    rarely runs compute-bound steps back to back), not before decode-only ones, and each point
    records the host's launch part of its step time."""
    from bench.engine import profile

    slept = []
    monkeypatch.setattr(profile.time, "sleep", lambda s: slept.append(s))
    monkeypatch.setattr(profile, "SUSTAIN_S", 0.05)
    out = tmp_path / "profile.json"
    rc = main(["profile", "--model", "tiny", "--num-blocks", "64", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "64", "--max-model-len", "256",
               "--decode-batch-sizes", "0,1", "--prefill-tokens", "0,32", "--context-lens", "16",
               "--packed-prefill-seqs", "", "--repeats", "2", "--warmup", "1",
               "--pause-ms", "40", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["pause_ms"] == 40.0
    prefill_points = [p for p in doc["points"] if p["num_prefill_tokens"]]
    assert len(prefill_points) == 2 and len(doc["points"]) == 3
    # 2 prefill points x (1 warmup + 2 repeats), then the pause check on the prefill-only point:
    # paused, back to back, paused again (1 warmup + 10 repeats each), and after decodes (its
    # pause filled with decode steps of a middle decode batch of the grid: no sleep)
    # ... and sustained: SUSTAIN_IDLE_S idle, then the step back to back, traced (no other sleep)
    # ... and sustained_mixed: the mixed step paused (1 warmup + 10 repeats), SUSTAIN_IDLE_S idle,
    # then traced back to back (issue 35, session 16)
    # ... and mixed_pattern_1 / _3: SUSTAIN_IDLE_S idle, then the mixed step with 1 / 3 decode steps
    # between, back to back (issue 35, session 20)
    assert slept == ([0.04] * (2 * 3 + 2 * 11) + [profile.SUSTAIN_IDLE_S] + [0.04] * 11
                     + [profile.SUSTAIN_IDLE_S] * 3)
    check = doc["pause_check"]
    assert check["num_prefill_tokens"] == 32
    # ... and sustained: the step back to back for SUSTAIN_S untimed, then timed back to back
    # (no sleep either)
    assert [r["run"] for r in check["runs"]] == ["paused", "back_to_back", "paused_again", "after_decode",
                                                 "sustained", "sustained_mixed", "mixed_pattern_1",
                                                 "mixed_pattern_3"]
    assert [r["pause_ms"] for r in check["runs"]] == [40.0, 0.0, 40.0, 40.0, 0.0, 0.0, 0.0, 0.0]
    # the capped engine's mixed step: min(32, max_num_seqs - 1) decodes of the grid's middle decode
    # context beside a chunk of min(256, max_num_batched_tokens - decodes), paused and traced
    mix = check["runs"][5]
    assert (mix["num_decode_seqs"], mix["num_prefill_tokens"], mix["decode_context_len"]) == (7, 57, 16)
    assert mix["paused_ms_median"] > 0 and mix["paused_pause_ms"] == 40.0
    assert len(mix["trace_ms"]) == len(mix["trace_t_ms"]) == mix["sustain_steps"] >= 1
    # the live pattern: the mixed step, then n decode steps of its decodes, in that order throughout;
    # each kind's median beside its paused / alone reference
    for run, n in zip(check["runs"][6:], (1, 3), strict=True):
        assert run["decode_steps_between"] == n and run["num_decode_seqs"] == 7
        kinds = run["pattern_kinds"]
        assert kinds.startswith("m" + "d" * n) and kinds == ("m" + "d" * n) * (len(kinds) // (n + 1))
        assert len(run["pattern_ms"]) == len(run["pattern_t_ms"]) == run["pattern_steps"] == len(kinds)
        assert run["paused_ms_median"] == mix["paused_ms_median"]
        assert run["step_ms_min"] <= run["step_ms_median"] <= run["step_ms_max"]
        assert run["decode_ms_median"] > 0 and run["decode_alone_ms_median"] > 0
    sus = check["runs"][4]
    assert sus["sustain_ms"] == 50.0 and sus["sustain_steps"] >= 1
    # every step of the sustained period timed: its start and its time (issue 35, session 15)
    assert len(sus["trace_ms"]) == len(sus["trace_t_ms"]) == sus["sustain_steps"]
    assert sus["trace_t_ms"][0] == 0.0 and sus["trace_t_ms"] == sorted(sus["trace_t_ms"])
    assert all(t > 0 for t in sus["trace_ms"]) and sus["trace_t_ms"][-1] < 50.0
    assert check["runs"][3]["decode_seqs_before"] == 1
    assert all(r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"] for r in check["runs"])
    for p in doc["points"]:
        assert 0 < p["launch_ms_median"] <= p["step_ms_median"]
