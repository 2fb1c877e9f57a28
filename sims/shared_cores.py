"""Backends that share their processors (issue 34): processor sharing of the steps in progress.

The event loop gives every backend a device of its own: a step takes its cost model's time
whatever the other backends do. Live on a CPU box, N backends with T torch threads each share C
cores: while B of them are in a step, the B x T threads get the C cores between them, so every
step in progress advances at rate min(1, C / (B x T)) of its solo time, and that rate changes
whenever another backend starts or ends a step (processor sharing). A backend's long prefill
step slows the others' decode steps while it runs, which a per-step factor cannot express.

`SharedCoreLoop` is the event loop with that rule: each step's cost-model time is its *work*
(solo seconds); at every step start and end the work done since the last change is taken off
every step in progress at the rate then, the rate is recomputed and the steps' end events are
moved (an end event superseded by a later one is stale and skipped). Every step is simulated
one by one (no decode stretches), and the ITL records carry the steps' shared durations.

`reserved_cores` takes cores off the backends for processes the loop does not simulate (the
gateway, the load generator): they sleep on I/O and a fair scheduler serves them first, so the
backends share what is left. The contention law is `SharedCores.rate`; the same engine takes
any law of the number of busy backends (`ContentionLaw`), e.g. two CUDA contexts time-slicing
one GPU (`gpu_time_slicing`: K x while more than one is busy, as `kv_pull_study --shared-gpu`'s
measured K).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sims.event_loop import _STEP, EventLoop

# the rate at which every step in progress advances, given how many backends are in a step
ContentionLaw = Callable[[int], float]


@dataclass(frozen=True)
class SharedCores:
    """`cores` shared by backends whose steps each run `threads` threads; `reserved_cores` of
    them go to processes outside the simulation first."""
    cores: float
    threads: float = 1.0
    reserved_cores: float = 0.0

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.threads <= 0 or self.reserved_cores < 0:
            raise ValueError("SharedCores: cores and threads > 0, reserved_cores >= 0")
        if self.reserved_cores >= self.cores:
            raise ValueError(f"SharedCores: {self.reserved_cores:g} reserved of {self.cores:g} "
                             "cores leaves the backends none")

    def rate(self, busy: int) -> float:
        """Progress rate of each of `busy` steps in progress (1: as fast as alone)."""
        if busy <= 0:
            return 1.0
        return min(1.0, (self.cores - self.reserved_cores) / (busy * self.threads))


def gpu_time_slicing(k: float) -> ContentionLaw:
    """Two or more contexts time-slicing one device: each step takes k x its time while another
    backend is in a step too (k = 2: equal slices of a saturated device)."""
    return lambda busy: 1.0 if busy <= 1 else 1.0 / k


class SharedCoreLoop(EventLoop):
    """The event loop with the backends' steps sharing processors (module docstring)."""

    def __init__(self, workload, cost, sched_config, config, law: SharedCores | ContentionLaw):
        if config.num_prefill_backends:
            raise ValueError("shared cores: a prefill-only backend is not a simulated step loop "
                             "(sims.kv_pull's FIFO server); not modelled")
        super().__init__(workload, cost, sched_config, replace(config, max_stretch_steps=1))
        self.law = law.rate if isinstance(law, SharedCores) else law
        nb = len(self.backends)
        self.work = [0.0] * nb         # solo seconds left of each backend's step in progress
        self.pending = [None] * nb     # the valid end event's time of each backend's step
        self.row = [0] * nb            # its step_rows index (the shared duration goes there)
        self.in_step: set[int] = set()
        self.rate = 1.0
        self.t_last = 0.0
        self.max_busy = 0
        self.shared_s = 0.0            # summed step time beyond the solo times

    # ---- the processor-sharing bookkeeping ---------------------------------------------------
    def _advance(self, now: float) -> None:
        """Take the work done since the last change off every step in progress."""
        done = (now - self.t_last) * self.rate
        if done > 0.0:
            work = self.work
            for b in self.in_step:
                work[b] -= done
        self.t_last = now

    def _reschedule(self, now: float) -> None:
        """The new rate; move the end events of the steps whose end it moves."""
        rate = self.law(len(self.in_step))
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"contention law gave rate {rate} for {len(self.in_step)} busy")
        if rate == self.rate:
            return
        self.rate = rate
        for b in self.in_step:
            self._schedule(b, now)

    def _schedule(self, b: int, now: float) -> None:
        end = now + max(0.0, self.work[b]) / self.rate
        if end != self.pending[b]:
            self.pending[b] = end
            be = self.backends[b]
            be.end_time = end
            self.push(end, _STEP, b)

    # ---- hooks into the loop ------------------------------------------------------------------
    def start_step(self, be, now: float, after_step: bool = True) -> None:
        rows = len(self.step_rows)
        super().start_step(be, now, after_step)
        if len(self.step_rows) == rows:  # no step started (idle); stretches are off
            return
        b = be.idx
        self._advance(now)
        self.row[b] = rows
        self.work[b] = be.end_time - now  # the solo time, as the parent scheduled it
        self.pending[b] = be.end_time     # the parent's own event stands while nothing changes
        self.in_step.add(b)
        self.max_busy = max(self.max_busy, len(self.in_step))
        rate = self.rate
        self._reschedule(now)
        if self.rate == rate and rate != 1.0:
            self._schedule(b, now)  # the rate stands below 1: this step's own end moves

    def on_step(self, arg: int, now: float):
        if self.pending[arg] != now:
            return True  # stale: its step's end moved
        self.pending[arg] = None
        self._advance(now)
        self.in_step.discard(arg)
        row = self.row[arg]
        n_dec, n_pre, solo = self.step_rows[row]
        shared = now - self.backends[arg].step_start
        self.step_rows[row] = (n_dec, n_pre, shared)
        self.shared_s += shared - solo
        self._reschedule(now)
        return super().on_step(arg, now)

    def result(self):
        res = super().result()
        res.extra["shared_cores"] = {"max_busy": self.max_busy, "extra_step_s": self.shared_s}
        return res


def simulate_shared(workload, cost, sched_config, config, law: SharedCores | ContentionLaw):
    return SharedCoreLoop(workload, cost, sched_config, config, law).run()
