"""The echo engine admits in the step scheduler's order (class of max_tokens, then arrival), so
that an echo backend with a constant step queues as our engine does and the simulator's step
scheduler on a constant step models it (issue 31)."""
from __future__ import annotations

from backend.engine.continuous import EngineConfig
from backend.engine.echo import EchoEngine
from backend.runner.sampler import SamplingParams


def test_fast_requests_are_admitted_before_earlier_slow_ones():
    eng = EchoEngine(EngineConfig(max_model_len=512, num_blocks=1024, block_size=16,
                                  max_num_seqs=1), vocab_size=259)
    for rid, n in (("slow", 100), ("normal", 20), ("fast1", 4), ("fast2", 2)):
        assert eng.add_request(rid, [1, 2, 3], SamplingParams(max_tokens=n)) is None
    started = []
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id not in started:
                started.append(out.request_id)
    assert started == ["fast1", "fast2", "normal", "slow"]
