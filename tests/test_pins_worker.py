"""Prefix pins through the backend worker's socket (issue 30): a pinned prompt survives KV
pressure that evicts an unpinned one, a pin over the budget is served unpinned and says so, the
LoadReport shows the pins, and an expired pin is evicted like any prefix."""
import random
import time

from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient, WorkerProcess

PIN_TTL_S = 8.0


def _send(c, rid, prompt, pin_ttl_s=0.0):
    env = pb.Envelope(batch=pb.Batch())
    r = env.batch.requests.add(request_id=rid, prompt_frame=0, pin_ttl_s=pin_ttl_s)
    r.sampling.max_tokens = 2
    r.sampling.ignore_eos = True
    c.send(env, [prompt])


def _run(c, rid, prompt, pin_ttl_s=0.0):
    """Send one request and read until it finishes: (first output's pin status, cached tokens)."""
    _send(c, rid, prompt, pin_ttl_s)
    pin = None
    while True:
        m = c.recv(60.0)
        if m.kind == "load_report":
            c.load_reports.append(m.envelope.load_report)
        elif m.kind == "error":
            raise AssertionError(m.envelope.error.message)
        elif m.kind == "step_output":
            for o in m.envelope.step_output.outputs:
                if o.request_id == rid:
                    if pin is None:
                        pin = o.pin_status
                    if o.finish_reason:
                        return pin, o.num_cached_tokens


def _pressure(c, tag, n=3):
    for k in range(n):  # 200 tokens = 50 of the 64 blocks each: every unpinned prefix goes
        rng = random.Random(f"{tag}{k}")
        _run(c, f"{tag}{k}", [rng.randrange(5, 250) for _ in range(200)])


def _report(c):
    while True:
        m = c.recv(5.0)
        if m.kind == "load_report" and m.envelope.load_report.num_running == 0:
            return m.envelope.load_report


def test_pinned_prefix_survives_pressure_budget_and_expiry(tmp_path):
    w = WorkerProcess(["--model", "tiny", "--load-format", "dummy", "--num-blocks", "64",
                       "--block-size", "4"], f"ipc://{tmp_path}/w.sock")
    try:
        c = DealerClient(w.endpoint)
        c.hello()
        pinned, unpinned, other = (list(range(s, s + 40)) for s in (10, 100, 200))
        assert _run(c, "p", pinned, PIN_TTL_S)[0] == pb.RequestOutput.PINNED
        t_pin = time.monotonic()
        assert _run(c, "u", unpinned)[0] == pb.RequestOutput.PIN_NONE
        # budget: 64 // 4 = 16 blocks; 10 pinned + 10 more > 16: served, unpinned, told so
        assert _run(c, "o", other, PIN_TTL_S)[0] == pb.RequestOutput.PIN_OVER_BUDGET
        _pressure(c, "x")
        assert _run(c, "u2", unpinned)[1] == 0            # evicted under pressure
        assert _run(c, "p2", pinned)[1] == 36             # kept: its 9 full blocks
        assert time.monotonic() - t_pin < PIN_TTL_S, "the machine was too slow to check in time"
        rep = _report(c)
        assert (rep.num_pins, rep.num_pinned_blocks, rep.pin_budget_blocks) == (1, 10, 16)
        assert rep.num_pins_refused == 1
        time.sleep(max(0.0, t_pin + PIN_TTL_S + 0.5 - time.monotonic()))
        _pressure(c, "y")
        assert _run(c, "p3", pinned)[1] == 0              # expired, then evicted
        rep = _report(c)
        assert rep.num_pins == 0 and rep.num_pins_expired >= 1
        c.close()
    finally:
        w.kill()
