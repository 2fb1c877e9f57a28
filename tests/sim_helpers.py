"""Shared pieces of the simulator's closed-form tests (tests/test_sims_async_plan.py,
tests/test_sims_shared_cores.py): a cost model with two fixed step times, and a workload built
from arrival times and output lengths; and a stand-in for a CUDA runner's step timing
(tests/test_sims_cap_onset.py, tests/test_sims_cap_sag.py)."""
import numpy as np

from sims.cost import ConstantCost
from sims.workload import Workload

PREFILL_S, DECODE_S = 0.100, 0.020


class TwoSpeedCost(ConstantCost):
    """A step with prefill tokens takes PREFILL_S, a decode-only one DECODE_S."""

    def __init__(self):
        super().__init__(DECODE_S)

    def step_time(self, num_decode_seqs, num_prefill_tokens, num_context_tokens):
        if not num_decode_seqs + num_prefill_tokens:
            return 0.0
        return PREFILL_S if num_prefill_tokens else DECODE_S


def workload(arrivals, outputs) -> Workload:
    """64-token prompts arriving at `arrivals` (s), each generating its `outputs` tokens."""
    n = len(arrivals)
    return Workload(arrival_time=np.array(arrivals, dtype=np.float64),
                    prompt_len=np.full(n, 64, dtype=np.int64),
                    output_len=np.array(outputs, dtype=np.int64),
                    prefix_group=np.full(n, -1, dtype=np.int64), prefix_len=np.zeros(n, dtype=np.int64),
                    queue_class=np.full(n, -1, dtype=np.int64), priority=np.zeros(n, dtype=np.int64))


class TimedStandInRunner:
    """A runner as the profile's pipelined runs see one on CUDA: `launch` / `finish`, two steps in
    flight at most, and each step's device time from its read-back slot (`buffers.device_seconds`),
    `step_ms(chunks, in_flight)` ms, in_flight the steps launched and not yet finished when it was
    launched (0: launched from an idle device). `device` may be set to the CPU (no timing events)."""

    def __init__(self, step_ms):
        import torch

        self.device = torch.device("cuda")
        self.step_ms = step_ms
        self.in_flight = 0
        self.ms: dict[int, float] = {}
        self.buffers = self

    def device_seconds(self, slot):
        return self.ms[slot] / 1e3

    def launch(self, chunks):
        from types import SimpleNamespace

        slot = len(self.ms)
        self.ms[slot] = self.step_ms(chunks, self.in_flight)
        self.in_flight += 1
        return SimpleNamespace(readback=slot)

    def finish(self, step):
        self.in_flight -= 1

