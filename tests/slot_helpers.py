"""Shared set-up of the slot model's closed-form admission tests (tests/test_retry_after_median.py,
tests/test_admission_normal_quantile.py): one backend of 4 reported slots held by running
requests whose last tokens are due at given steps from now, its step time measured first."""
from scheduler.admission import AdmissionConfig, WaitPredictor
from scheduler.clock import ManualClock

FAST = 0
STEP = 0.010  # the backend's measured step, s


def slot_backend(slo, running_class: int, end_steps, **config) -> tuple[WaitPredictor, ManualClock]:
    """A WaitPredictor (slot model, `slo`, `config`) on a ManualClock at t = 100 s + 6 steps:
    backend 0 measured a 5-token request over 4 steps (its step: STEP), then 4 slots, each held by
    a request of `running_class` (40 tokens) whose last token is due `end_steps[j]` steps from now,
    nothing queued; the arrivals counted for long (the rate is the 2 s window's count)."""
    clock = ManualClock(100.0)
    p = WaitPredictor(AdmissionConfig(slot_model=True, slo=slo, **config))
    p.clock = clock.now
    p.add_backend(0)
    k = ("warm", 0)
    p.dispatched(0, FAST, k, 5)
    clock.set(clock.now() + 2 * STEP)
    p.started(0, FAST, clock.now(), 2 * STEP, 0, key=k)
    clock.set(clock.now() + 4 * STEP)
    p.finished(0, k, clock.now(), 5)
    p.set_slots(0, 4)
    now = clock.now()
    for j, end in enumerate(end_steps):
        k = ("run", j)
        p.dispatched(0, running_class, k, 40)
        p.started(0, running_class, now + end * STEP - 39 * STEP, 0.0, 0, key=k)
    p.backends[0].arr_t0 = now - 60.0
    return p, clock
