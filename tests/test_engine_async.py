"""Async scheduling (backend.engine): step k+1 planned and launched while step k runs, its
decodes fed from step k's sampled ids on the device, placeholder tokens set right once read
back. Greedy outputs must equal the synchronous loop's."""
from __future__ import annotations

from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler


def test_set_token_overwrites_a_placeholder_and_ignores_unknown_requests():
    s = StepScheduler(SchedulerConfig(max_model_len=64, num_blocks=16, max_num_seqs=4,
                                      max_num_batched_tokens=64, block_size=4))
    assert s.add_request("a", [1, 2, 3], 4, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult(sampled={"a": 0}))  # placeholder for the first output token
    assert s.requests["a"].token_ids == [1, 2, 3, 0]
    assert s.set_token("a", 3, 42)
    assert s.requests["a"].token_ids == [1, 2, 3, 42]
    assert not s.set_token("a", 9, 1)  # not sampled yet
    assert not s.set_token("gone", 0, 1)
    s.check_integrity()
