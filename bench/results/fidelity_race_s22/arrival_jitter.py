"""Issue 35, session 22 (the tool form since: `validate_replay --ceiling`, bench.simulator.schedule_ceiling;
this script made the session's jitter_*.txt, with the latency figures' scatter the tool does not report):
how much of the same-chunks shortfall is the race between a request's
arrival at the engine and the engine's plan of a step, a race no model of the mean timings can call.

The replay form is the grid's live diagnostic (every live step time fed back where the schedules
agree, the gateway's loop, the measured plan leads: `validate_replay --live-times --gateway-loop on
--plan-lead live`), so the steps' durations are out of the question. Then each Batch message's
gateway -> engine delay (the simulator's `network_delay_s`, the median of the flush -> plan delays
measured on requests flushed while the engine was idle: `fidelity_steps.dispatch_delay`) is drawn
instead from those same measured delays, one draw a message. Reported, per load, the same-chunks
share (`decision_fidelity.compare_steps`, as the grid's tables):

  live / sim          the grid's figure (no draw)
  live / sim+jitter   with the drawn delays (mean over draws)
  sim / sim+jitter    the simulator against itself, only the delays drawn: how alike two runs of
                      one workload are when only this host-side jitter differs
and the latency figures' scatter between the simulator and itself with the draws: the spread between
seeds that no model of the mean timings removes, and the 5-seed interval it alone makes.

Env: SCATTER=SIGMA also multiplies each step time by (1 + SIGMA z) in the drawn runs (the live
steps' own scatter at one shape); DELAYS=off draws no delays (the scatter alone).

Run from the repo root:  python bench/results/fidelity_race_s22/arrival_jitter.py PART_DIR [DRAWS] [SEEDS]
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

# step-time scatter in the drawn runs: 0 none, a sigma (iid normal), or "empirical": each step's
# time times exp(r / sqrt 2), r drawn from the part's back-to-back decode-only log ratios (step_noise)
SCATTER = os.environ.get("SCATTER", "0")
SIGMA = 0.0 if SCATTER == "empirical" else float(SCATTER)
DELAYS = os.environ.get("DELAYS", "on") == "on"  # the drawn gateway -> engine delays

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import sims.decision_replay as dr
import sims.event_loop as el
from bench.simulator import validate_replay as vr
from bench.simulator.decision_fidelity import compare_steps
from bench.simulator.fidelity_steps import idle_dispatch_delays
from bench.simulator.schedule_ceiling import step_scatter
from bench.simulator.validate import prefill_steps_of
from scheduler.decisions import read_log


def step_noise(rows):
    """The live steps' own scatter (`schedule_ceiling.step_scatter`: back-to-back decode-only steps
    at one decode count, log ratio over sqrt 2): how many pairs, its sd, its robust sd."""
    global RATIOS
    RATIOS = step_scatter(rows)
    mad = 1.4826 * np.median(np.abs(RATIOS - np.median(RATIOS)))  # robust: a stall now and then
    return len(RATIOS), float(np.std(RATIOS)), float(mad)


RATIOS = np.zeros(1)
FIGS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "throughput")


class Scatter:
    """A cost model with each step time multiplied by (1 + sigma z), z iid normal: the live steps'
    own scatter at one exact shape (2-2.5% on the H200, `../fidelity_chunks_s18/call_level.txt` 3)."""
    def __init__(self, inner, sigma, rng):
        self.inner, self.sigma, self.rng = inner, sigma, rng
        self.accepts_prefill_chunks = getattr(inner, "accepts_prefill_chunks", False)

    def _factor(self, n=None):
        if SCATTER == "empirical":
            return np.exp(self.rng.choice(RATIOS, size=n)) if n is not None else float(np.exp(self.rng.choice(RATIOS)))
        z = self.rng.standard_normal(n) if n is not None else float(self.rng.standard_normal())
        return np.maximum(0.5, 1.0 + self.sigma * z)

    def step_time(self, *a, **k):
        return self.inner.step_time(*a, **k) * self._factor()

    def decode_times(self, n, ctx, k):
        t = self.inner.decode_times(n, ctx, k)
        return t * self._factor(len(t))

    def __getattr__(self, name):
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class Jitter:
    """`EventLoop.delay` as a property: the configured delay plus one centred draw a read (each
    read is one Batch message's gateway -> engine trip), messages kept in order (`send`)."""
    def __init__(self, centred, seed):
        self.centred, self.rng, self.on = centred, np.random.default_rng(seed), False

    def install(self):
        jit = self

        def get(loop):
            d = loop.__dict__["_delay0"]
            return max(0.0, d + float(jit.rng.choice(jit.centred))) if jit.on and DELAYS else d

        def put(loop, v):
            loop.__dict__["_delay0"] = v
        el.EventLoop.delay = property(get, put)
        plain_send = el.EventLoop.send

        def send(loop, be, part, now):
            """As `EventLoop.send`, but a message never overtakes the one before it to the same
            backend (one ZeroMQ connection delivers in order): its delivery is at least the last's."""
            if not jit.on or not DELAYS:
                return plain_send(loop, be, part, now)
            if loop.pulls is not None:
                part = loop.pulls.divert(be, part, now)
                if not part:
                    return
            at = now
            if loop.gw_message_s > 0:
                at = loop.gw_free = max(now, loop.gw_free) + loop.gw_message_s
            at += loop.delay
            last = loop.__dict__.setdefault("_last_at", {})
            at = max(at, last.get(be.idx, at))
            last[be.idx] = at
            if at > now:
                loop.push(at, el._DELIVER, (be.idx, part))
            else:
                loop.deliver(be, part, now)
        el.EventLoop.send = send


def main():
    part = Path(sys.argv[1]); draws = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seeds = {int(s) for s in sys.argv[3].split(",")} if len(sys.argv) > 3 else None
    tag = part.name
    validate = json.loads((part / f"validate_{tag}.json").read_text())
    arrivals, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
    from bench.simulator.fidelity_steps import read_steps
    rows = read_steps(part / f"steps_{tag}.jsonl.gz")
    d = idle_dispatch_delays(rows, batches)
    q = np.percentile(d, [5, 25, 50, 75, 95]) * 1e3
    print(f"{tag}: {len(d)} requests flushed while the engine was idle; flush -> plan delay ms "
          f"p5 / p25 / p50 / p75 / p95 = {' / '.join(f'{x:.3f}' for x in q)}")
    n, sd, rsd = step_noise(rows)
    print(f"live step scatter (back-to-back decode-only steps at one decode count, n {n}): "
          f"sd {100 * sd:.2f}%, robust sd {100 * rsd:.2f}%")
    centred = d - np.median(d)
    caught = []
    orig = dr.replay_run

    def wrap(arr, sched, cost, *a, **k):
        if jit.on and (SIGMA > 0 or SCATTER == "empirical"):
            cost = Scatter(cost, SIGMA, jit.rng)
        res, b = orig(arr, sched, cost, *a, **k)
        caught.append((arr, res))
        return res, b
    dr.replay_run = wrap
    jit = Jitter(centred, 0)
    jit.install()
    print(f"drawn: {'the delays' if DELAYS else 'no delays'}; step-time scatter {SCATTER}")
    kw = {"seeds": seeds, "gateway_loop": True, "live_times": True, "plan_lead": "live"}
    prof = str(part / f"profile_{tag}.json")

    def steps_by_run():
        caught.clear()
        rep = vr.replay_session(validate, arrivals, batches, rows, prof, **kw)
        sims = [{k: c["sim"] for k, c in r["compare_replay_path"].items()}
                for ld in rep["loads"] for r in ld["runs"]]
        return [({a.request_id for a in arr}, dr.step_records(res, arr), figs)
                for (arr, res), figs in zip(caught, sims, strict=True)]
    base = steps_by_run()
    jittered = []
    for k in range(draws):
        jit.rng = np.random.default_rng(1000 + k); jit.on = True
        jittered.append(steps_by_run())
        jit.on = False
    from scheduler.decisions import step_from_json
    live_all = [step_from_json(r) for r in rows]
    labels = [(ld["load_label"], int(r["seed"])) for ld in validate["loads"] for r in ld["runs"]
              if seeds is None or int(r["seed"]) in seeds]
    out, lat = {}, {}
    for i, (lab, seed) in enumerate(labels):
        ids, sim0, f0 = base[i]
        for j in jittered:
            lat.setdefault(lab, []).append([100 * (j[i][2][k] / f0[k] - 1) for k in FIGS])
        L = prefill_steps_of(live_all, ids)
        S0 = prefill_steps_of(sim0, ids)
        lj = [compare_steps(L, prefill_steps_of(j[i][1], ids))["same_prefill_step_share"] for j in jittered]
        sj = [compare_steps(S0, prefill_steps_of(j[i][1], ids))["same_prefill_step_share"] for j in jittered]
        out.setdefault(lab, []).append((compare_steps(L, S0)["same_prefill_step_share"], np.mean(lj), np.mean(sj)))
    print(f"same chunks, % (mean over seeds{'' if seeds is None else ' ' + str(sorted(seeds))}; "
          f"{draws} draws of the delays)")
    print("load    live/sim  live/sim+jitter  sim/sim+jitter")
    for lab, v in out.items():
        a = np.array(v) * 100
        print(f"{lab:>5}  {a[:, 0].mean():8.1f}  {a[:, 1].mean():15.1f}  {a[:, 2].mean():14.1f}")
    from scipy import stats
    n = len({s for _, s in labels})
    t5 = stats.t.ppf(0.975, 4) / np.sqrt(5)
    print("\nlatency, sim+jitter / sim - 1 (%), sd over seeds x draws: how far one run's figure moves with the"
          "\njitter alone; x 2.78 / sqrt 5 = the half-width of a 5-seed 95% interval that this scatter alone makes")
    print("load   " + "   ".join(f"{k:>10}" for k in FIGS) + "   (5-seed half-width)")
    for lab, v in lat.items():
        a = np.array(v)
        sd = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros(len(FIGS))
        print(f"{lab:>5}  " + "   ".join(f"{x:10.2f}" for x in sd) + "   ("
              + " / ".join(f"{t5 * x:.1f}" for x in sd) + f"; {n} seeds x {draws} draws)")


if __name__ == "__main__":
    main()
