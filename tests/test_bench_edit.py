"""`tidegate bench serve --workload edit|completion [--oracle]` (bench.serving.edit) against the
gateway and a backend that speculates from the prediction (tests/test_prediction_api.py's)."""
from __future__ import annotations

import numpy as np
import pytest
from test_gateway_http import ipc_address, make_config
from test_prediction_api import SpeculatingBackend

from bench.serving.edit import (
    LINE_TOKENS,
    alter_token_lines,
    code_files,
    completion_prompt,
    edit_prompt,
    run_workload,
)
from gateway.app import create_app
from gateway.backend_pool import PoolConfig


@pytest.fixture
async def backend():
    b = await SpeculatingBackend(ipc_address()).start()
    yield b
    await b.stop()


@pytest.fixture
async def url(aiohttp_client, backend):
    # the production heartbeat (10 s), not the failover tests' 1 s: these tests drive workloads, and under
    # a loaded CI machine (two test workers beside the soak) the fake backend once went 1.1 s unheard,
    # was marked down and its requests failed over to nothing (CI, 2026-12-07)
    pool = PoolConfig(heartbeat_timeout_s=10.0, hello_interval_s=0.1)
    client = await aiohttp_client(create_app(make_config(backend.address, pool=pool), startup_wait_s=5.0))
    return str(client.make_url("")).rstrip("/")


def test_prompts_hold_real_code():
    files = code_files(None, 3, seed=1, max_chars=800)
    assert len(files) == 3 and all(name.endswith(".py") for name, _ in files)
    assert all(0 < len(text) <= 800 and text.endswith("\n") for _, text in files)
    assert files == code_files(None, 3, seed=1, max_chars=800)  # by seed
    name, text = files[0]
    prompt = edit_prompt(name, text, "add type hints")
    assert text in prompt and "add type hints" in prompt
    # the file first: the engine's session key (the first 64 tokens) differs from file to file
    assert prompt.startswith(f"# File: {name}\n{text[:40]}")
    assert text.startswith(completion_prompt(text))
    held = code_files("heldout", 2, seed=0, max_chars=800)  # tiny-coder's held-out code
    assert len(held) == 2 and all(text for _, text in held)


def test_oracle_alters_whole_lines_of_token_ids():
    ids = list(range(10, 30))
    texts = ["a", "b\n", "c", "d", "\n", "e", "f\n", "g", "h", "i\n"] * 2  # 8 lines
    same = alter_token_lines(ids, texts, 1.0, np.random.default_rng(0))
    assert same == ids
    half = alter_token_lines(ids, texts, 0.5, np.random.default_rng(0))
    changed = {i for i, (a, b) in enumerate(zip(ids, half)) if a != b}
    lines = [range(2), range(2, 5), range(5, 7), range(7, 10), range(10, 12),
             range(12, 15), range(15, 17), range(17, 20)]
    hit = [ln for ln in lines if set(ln) & changed]
    assert len(hit) == 4 and all(set(ln) <= changed for ln in hit)  # whole lines, half of them
    assert set(half) <= set(ids)  # ids of the output itself: in the vocabulary
    # too few newlines (dummy weights): lines of LINE_TOKENS tokens
    ids = list(range(100, 148))
    alt = alter_token_lines(ids, [""] * 48, 0.75, np.random.default_rng(0))
    changed = {i // LINE_TOKENS for i, (a, b) in enumerate(zip(ids, alt)) if a != b}
    assert len(changed) == 1 and sum(a != b for a, b in zip(ids, alt)) == LINE_TOKENS
    # dummy weights repeating one token: the prompt's ids alter it
    same = [7] * 48
    alt = alter_token_lines(same, [""] * 48, 0.5, np.random.default_rng(0), pool=[3, 4, 5])
    assert sum(t != 7 for t in alt) == 2 * LINE_TOKENS and set(alt) <= {3, 4, 5, 7}


async def test_oracle_edit_runs(url, backend):
    out = await run_workload(url=url, endpoint="/v1/completions", model="tiny", workload="edit",
                             oracle=True, keeps=[1.0, 0.0], num_requests=3, max_tokens=40,
                             concurrency=2, seed=0, corpus=None, file_chars=600,
                             flush_sessions=5)
    runs = out["runs"]
    # the baseline twice: cold (it fills the prefix cache) and warm (the reference, timed as
    # the runs with a prediction are)
    assert set(runs) == {"off_cold", "off", "keep=1", "keep=0"}
    assert all(r["completed"] == 3 for r in runs.values())
    assert set(out["tpot_p50_ratio_vs_off"]) == {"off_cold", "keep=1", "keep=0"}
    # the baseline ran with speculation off; the oracle's predictions went as token ids
    offs = [r for r in backend.requests.values() if r.speculation.off]
    # 2 baselines, then a flush of the session store before each of the 2 runs with a prediction
    assert len(offs) == 2 * 3 + 2 * 5 and len(backend.predictions) == 6
    flush = [r for r in offs if r.sampling.max_tokens == 1]
    assert len(flush) == 2 * 5
    full = runs["keep=1"]
    assert full["prediction_tokens"]["accepted"] == 3 * 40
    assert full["prediction_tokens"]["rejected"] == 0
    assert full["spec_decode"]["acceptance_rate"] == 1.0
    # by draft source: the fake reports none in its LoadReports, so its requests' own counters
    assert full["spec_decode"]["acceptance_by_source"] == {"unknown": 1.0}
    assert out["tpot_p50_ratio_vs_off"]["keep=1"] < 0.7  # k + 1 tokens a step
    assert runs["keep=0"]["prediction_tokens"]["accepted"] < 3 * 40


async def test_completion_workload_runs_off_and_on(url, backend):
    out = await run_workload(url=url, endpoint="/v1/completions", model="tiny",
                             workload="completion", oracle=False, keeps=[1.0], num_requests=2,
                             max_tokens=8, concurrency=1, seed=0, corpus=None, file_chars=600)
    assert set(out["runs"]) == {"off", "on"}
    assert all(r["completed"] == 2 for r in out["runs"].values())


def test_random_workload_passes_the_speculation_field():
    from bench.serving.loadgen import HttpTarget, request_body

    assert "speculation" not in request_body(HttpTarget(), "m", [1, 2], 4)
    body = request_body(HttpTarget(speculation="off"), "m", [1, 2], 4)
    assert body["speculation"] == "off"


def test_spec_validate_compares_shared_runs():
    from bench.simulator.spec_validate import compare

    def live_run(tpot, tps, drafts, tokens, accepted):
        return {"tpot_ms": {"p50": tpot}, "output_throughput": tps, "completed": 4,
                "spec_decode": {"vllm:spec_decode_num_drafts_total": drafts,
                                "vllm:spec_decode_num_draft_tokens_total": tokens,
                                "acceptance_rate": accepted / tokens if tokens else None}}

    def sim_run(tpot_s, tps, verifies, tokens, accepted):
        return {"tpot_p50_s": tpot_s, "output_throughput_tok_s": tps, "num_requests": 4,
                "verifies": verifies, "draft_tokens": tokens,
                "acceptance_rate": accepted / tokens if tokens else None}

    live = {"concurrency": 8, "runs": {"off": live_run(20.0, 400.0, 0, 0, 0),
                                       "keep=0.75": live_run(8.0, 1000.0, 100, 800, 700)}}
    sim = {"runs": {"keep=0.75": {"off": sim_run(0.0203, 396.0, 0, 0, 0),
                                  "on": sim_run(0.0090, 1000.0, 100, 790, 700)}}}
    rows = {r["run"]: r for r in compare(live, sim)}
    assert rows["off"]["within_5pct"] and not rows["keep=0.75"]["within_5pct"]
    assert rows["keep=0.75"]["tpot_p50_ms_ratio"] == pytest.approx(9.0 / 8.0)
    assert rows["keep=0.75"]["live"]["draft_tokens_per_verify"] == 8.0
    assert rows["keep=0.75"]["sim"]["draft_tokens_per_verify"] == 7.9


def test_the_flush_pushes_earlier_sessions_out_of_the_engines_store():
    """The oracle's baseline outputs must not be drafted from the session store in the measured
    runs: FLUSH_SESSIONS requests evict them from a store of the engine's default size."""
    from bench.serving.edit import FLUSH_SESSIONS, SESSION_PREFIX, flush_prompt
    from scheduler.speculation import SpeculationConfig, Speculator, session_key

    cfg = SpeculationConfig()
    assert cfg.session_prefix_tokens == SESSION_PREFIX and FLUSH_SESSIONS > cfg.max_sessions
    spec = Speculator(cfg)
    prompt = list(range(500, 600))
    spec.add("base", prompt)
    spec.append("base", [1, 2, 3])
    spec.finish("base")
    key = session_key(prompt, cfg.session_prefix_tokens)
    assert spec.sessions.get(key) is not None
    for i in range(FLUSH_SESSIONS):
        rid = f"f{i}"
        spec.add(rid, flush_prompt(i), off=True)
        spec.append(rid, [7])
        spec.finish(rid)
    assert spec.sessions.get(key) is None
    assert len({session_key(flush_prompt(i), SESSION_PREFIX) for i in range(FLUSH_SESSIONS)}) \
        == FLUSH_SESSIONS


async def test_oracle_edit_over_chat(url, backend, tmp_path):
    out = await run_workload(url=url, endpoint="/v1/chat/completions", model="tiny",
                             workload="edit", oracle=True, keeps=[1.0], num_requests=2,
                             max_tokens=30, concurrency=1, seed=3, corpus=None, file_chars=500,
                             flush_sessions=0, trace_dir=str(tmp_path))
    full = out["runs"]["keep=1"]
    assert full["completed"] == 2 and full["prediction_tokens"]["accepted"] == 60
    import json
    rows = [json.loads(line) for line in (tmp_path / "keep=1.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["prompt"] and len(r["output"]) == 30 for r in rows)
    assert all(r["prediction"] == r["output"] for r in rows)  # 100% kept: exact
