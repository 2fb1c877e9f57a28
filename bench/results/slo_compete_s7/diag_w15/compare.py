"""Issue 31, seventh session: the admission check's view of the backends, live (gateway A of a
1.5x run with the 600 ms window) vs the forced replay of its decision log, arrival by arrival.
Both traces come from `trace.patch` (a diagnostic applied to a copy of 020a59e, not committed:
each check writes the predictor's per-backend state to $TG_ADM_TRACE.PID). From this directory:
`python compare.py` prints, every 25th arrival, the point prediction live / replay and the
backends' slots, step (ms), running, running with an end ahead, sent-and-not-started, and
predicted TTFT (ms)."""
import gzip
import json

with gzip.open("trace_live_gateway_a.jsonl.gz", "rt") as fh:
    live = [json.loads(line) for line in fh]
with gzip.open("trace_sim_forced.jsonl.gz", "rt") as fh:
    sim = [json.loads(line) for line in fh]


def agg(x: dict) -> tuple:
    be = list(x["be"].values())
    return (sorted(b["slots"] for b in be), sorted(round(b["step"], 1) for b in be),
            sum(b["running"] for b in be), sum(b["live_fin"] for b in be),
            sum(b["queued"] for b in be), sorted(b["ttft_ms"] for b in be))


t0l, t0s = live[0]["now"], sim[0]["now"]
q_l = q_s = 0
for i, (lv, sv) in enumerate(zip(live, sim)):
    q_l += sum(b["queued"] for b in lv["be"].values())
    q_s += sum(b["queued"] for b in sv["be"].values())
    if i % 25 == 0:
        print(f"{lv['now'] - t0l:6.2f} class {lv['cls']} pred {lv['pred_ms']:7.1f} / {sv['pred_ms']:7.1f}")
        print("    live", agg(lv))
        print("    sim ", agg(sv))
print(f"sent and not started, mean over the {len(live)} checks: live {q_l / len(live):.1f}, "
      f"replay {q_s / len(sim):.1f}")
