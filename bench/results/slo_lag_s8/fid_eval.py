"""Issue 31, eighth session: the fidelity figures of fid_join.py for many runs and replay settings.

    .venv/bin/python bench/results/slo_lag_s8/fid_eval.py OUT.json RUN_DIR...

Settings (each RUN_DIR's rate from its rate.txt): "before" (the seventh session's replay: a 20 ms
constant step, no delays); "cadence" (the step the live echo backends kept, measured by
lag_parts.py: the 20 ms sleep's overshoot plus the worker loop between steps: the run's own from
its lag_parts.json where traced, else this session's mean at its load); "cadence+gw" (also the
gateway's time per Batch, serialized, and the wire + the backend loop's read, as measured:
EngineConfig.gateway_message_s / network_delay_s); "gw" (a 20 ms step with those delays: for
runs whose echo backends pace their steps, backend/engine/echo.py since this session).
SETTINGS=before,gw picks some.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

# per load (rate): measured this session (lag_parts.py, trace runs fid_w10*/fid_w15*): the busy
# backends' cadence (step + gap), the gateway's window time / 4 Batches, the wire + loop read
CADENCE = {"31.9": 20.63, "47.8": 20.78}   # fid_w10a-c / fid_w15a-c (unpaced), means
GW_US = {"31.9": 560, "47.8": 870}          # gateway time per window / 4 Batches, means
NET_MS = 0.5                                # R - S less the step under way, p50
SETTINGS = {
    "before": lambda r, c: ["--step-ms", "20"],
    "cadence": lambda r, c: ["--step-ms", f"{c:.2f}"],
    "cadence+gw": lambda r, c: ["--step-ms", f"{c:.2f}", "--gateway-message-us", str(GW_US[r]),
                                "--network-delay-ms", str(NET_MS)],
    "gw": lambda r, c: ["--step-ms", "20", "--gateway-message-us", str(GW_US[r]),
                        "--network-delay-ms", str(NET_MS)],
}
HERE = Path(__file__).resolve().parent


def main() -> None:
    out_path, runs = sys.argv[1], sys.argv[2:]
    res = []
    for run in runs:
        rate = (Path(run) / "rate.txt").read_text().split()[-2]
        lp = Path(run) / "lag_parts.json"
        if lp.exists():
            j = json.loads(lp.read_text())
            cad = j["step_ms"] + j["gap_ms"]
        else:
            cad = CADENCE[rate]
        pick = os.environ.get("SETTINGS")
        for name, flags in SETTINGS.items():
            if pick and name not in pick.split(","):
                continue
            p = subprocess.run([sys.executable, str(HERE / "fid_join.py"), run, "--slo-ttft-ms",
                                "fast=750,normal=1000,slow=1600", "--target-throughput", "1",
                                "--min-latency-ms", "600", "--no-idle-flush", *flags(rate, cad)],
                               capture_output=True, text=True, check=True)
            d = json.loads(p.stdout.splitlines()[0])
            lt, st = d["ttft_p50_ms_both_live_sim"]
            row = {"run": Path(run).name, "rate": rate, "setting": name, "cadence_ms": cad,
                   "same_decision": d["same_decision"], "same_decision_forced": d["same_decision_forced"],
                   "requests_same_window": d["requests_same_window"], "ttft_p50_live": lt,
                   "ttft_p50_sim": st, "mean_window": d["mean_window"]}
            res.append(row)
            print(f"| {row['run']} | {rate} | {name} ({' '.join(flags(rate, cad))}) | {100 * d['same_decision']:.1f}% "
                  f"({100 * d['same_decision_forced']:.1f}%) | {100 * d['requests_same_window']:.1f}% | "
                  f"{lt:.0f} / {st:.0f} | {100 * (st / lt - 1):+.1f}% |", flush=True)
    Path(out_path).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
