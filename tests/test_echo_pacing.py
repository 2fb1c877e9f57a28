"""The echo engine's step delay paces its steps (issue 31, eighth session): steps back to back keep
one every `step_delay_s`, the worker loop's time between them inside it (a constant step, as the
simulator models it); a step after an idle gap takes a whole step."""
from backend.engine import echo as echo_mod
from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_steps_back_to_back_keep_the_cadence(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(echo_mod, "time", clock)
    engine, _ = create_engine(BackendConfig(model="echo", echo_step_ms=20.0))
    assert engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=10)) is None
    ends = []
    for _ in range(5):
        engine.step()
        ends.append(clock.t)
        clock.t += 0.003  # the worker loop between steps: 3 ms
    # one step every 20 ms, not every 23
    assert [round(e - ends[0], 9) for e in ends] == [0.0, 0.02, 0.04, 0.06, 0.08]
    assert abs(clock.sleeps[0] - 0.02) < 1e-12 and all(abs(s - 0.017) < 1e-9 for s in clock.sleeps[1:])
    # idle for longer than a step: the next step is a whole step from its start
    clock.t += 0.5
    start = clock.t
    engine.step()
    assert abs(clock.t - start - 0.02) < 1e-12
