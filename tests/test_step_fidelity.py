"""Step-level decision fidelity (issue 18): the live engine and the simulator, admitting the same
requests before the same steps, run the same steps — which requests prefill in which chunks at
which step, how many decode, who is preempted.

The live side is the real `backend.engine.continuous.Engine` (a small random checkpoint on the CPU, its own
StepScheduler, KV pool and sampler; `ignore_eos`, so lengths are max_tokens), its plans recorded by
`backend.server.step_log.StepLog` (what `--step-log` writes). The simulated side is the whole event loop
(`sims.decision_replay.replay_run` with `record_steps`): batcher with no window, a 10 ms constant
step, each request arriving half a step before the step the engine admitted it at; the backend
never idles, so step k starts at t0 + k * 10 ms, which the test checks first. The pool is small
enough that sequences are preempted.
"""
from __future__ import annotations

import random

import pytest

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams
from backend.server.step_log import StepLog
from bench.simulator.decision_fidelity import compare_steps
from scheduler.batcher import BatcherConfig
from scheduler.decisions import ArrivalRecord, StepRecord, read_steps
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import replay_run, step_records
from tests.backend_helpers import make_checkpoint

BLOCK, NUM_BLOCKS, MAX_SEQS, MAX_TOKENS = 4, 48, 4, 24
DT, T0 = 0.010, 100.0


def admissions(seed: int = 0) -> list[tuple[int, str, int, int]]:
    """(step, id, prompt length, max_tokens): two to start, then one every 1-4 steps."""
    rng = random.Random(seed)
    out, k = [(0, "r0", 30, 20), (0, "r1", 9, 28)], 0
    for i in range(2, 18):
        k += rng.randint(1, 4)
        out.append((k, f"r{i}", rng.randint(3, 45), rng.randint(8, 30)))
    return out


def run_engine(path, adm, log_path) -> list[StepRecord]:
    engine, loaded = create_engine(BackendConfig(
        model=str(path), block_size=BLOCK, num_blocks=NUM_BLOCKS, max_num_seqs=MAX_SEQS,
        max_num_batched_tokens=MAX_TOKENS, cpu_threads=1))
    rng = random.Random(1)
    log = StepLog(log_path)
    pending = sorted(adm)
    k = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] == k:
            _, rid, n, m = pending.pop(0)
            prompt = [rng.randrange(loaded.config.vocab_size) for _ in range(n)]
            assert engine.add_request(f"00/{rid}", prompt, SamplingParams(max_tokens=m, ignore_eos=True)) is None
        step = engine.begin_step()
        engine.finish_step(step)
        log.record(T0 + k * DT, 0.0, step.plan)
        k += 1
        assert k < 2000
    log.write()
    return read_steps(log_path)


@pytest.mark.slow
def test_engine_and_simulator_run_the_same_steps(tmp_path):
    path = make_checkpoint(tmp_path, "gqa4_tied_rope4")
    adm = admissions()
    live = run_engine(path, adm, tmp_path / "steps.jsonl")
    arrivals = [ArrivalRecord(rid, T0 + (k - 0.5) * DT if k else T0, n, m, -1)
                for k, rid, n, m in adm]
    sched = SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=0.0, idle_flush=False),
                               max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS,
                               block_size=BLOCK, max_model_len=512, enable_prefix_caching=True)
    result, _ = replay_run(arrivals, sched, ConstantCost(DT, num_blocks=NUM_BLOCKS), record_steps=True)
    sim = step_records(result, arrivals)
    # the alignment the comparison rests on: the simulated backend never idled
    assert [round((s.t - T0) / DT, 6) for s in sim] == list(range(len(sim)))
    r = compare_steps(live, sim)
    assert r["preemptions"][0] > 0  # the pool is small enough to preempt
    assert r["sequence_identical"], r
    assert r["same_prefill_step_share"] == 1.0 and r["requests_chunked_alike"] == 1.0
    assert r["num_prefill_steps"][0] > 10 and r["num_steps"][0] == len(live) > 50
    # the comparison notices a difference: one request prefilled in other chunks
    j = [i for i, s in enumerate(sim) if s.prefill][3]
    moved = [StepRecord(s.t, s.num_decodes, tuple((c[0], c[1] - 1, c[2]) for c in s.prefill),
                        s.preempted) if i == j else s for i, s in enumerate(sim)]
    r2 = compare_steps(live, moved)
    assert not r2["sequence_identical"] and r2["same_prefill_step_share"] < 1.0
