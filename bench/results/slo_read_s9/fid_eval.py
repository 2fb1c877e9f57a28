"""Issue 31, ninth session: the fidelity figures of fid_join.py (this directory's) for many runs
and replay settings.

    .venv/bin/python bench/results/slo_read_s9/fid_eval.py OUT.json RUN_DIR...

Settings (each RUN_DIR's rate from its rate.txt; every one a 20 ms constant step, the paced echo
backends' cadence):
  "s8"     the eighth session's replay: the gateway's time per Batch (serialized; 560 / 870 us
           at 1.0x / 1.5x, 500 us at 0.5x: measured, slo_lag_s8) and the wire (0.5 ms);
  "prompts" also each prompt its own, hashed for placement as the live gateway hashes the
           bench's random prompts (a cold prefix goes to the next backend in turn);
  "read"   also the gateway's read of a step's outputs `READ_MS` after its end
           (EngineConfig.gateway_read_delay_s; the run's own step end -> read p50 where traced:
           lag_parts.json "outputs O-E" + "wire+gateway G-O"), its predictor noting each
           dispatch at its Batch's send.
Runs named cw_* ran with `tidegate serve --compete-window`: their replays get it too.
SETTINGS=s8,read picks some. Each row: same decisions free, forced (admission as live), forced
with the live placement too (traced runs), the share of requests the forced replay placed where
the live gateway did, mean windows live / replay, TTFT p50 live / free replay (the requests
admitted on both sides) and the forced-with-placement replay's TTFT p50 vs live (the requests
admitted live: the timing model alone).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

GW_US = {"15.9": 500, "31.9": 560, "47.8": 870}  # gateway time per window / 4 Batches
NET_MS = 0.5                                      # the wire + the backend loop's read, p50
READ_MS = 1.1   # step end -> the gateway's read of its outputs, p50 (slo_lag_s8 paced_w15a 1.16)
HERE = Path(__file__).resolve().parent


def settings(rate: str, read_ms: float) -> dict[str, list[str]]:
    s8 = ["--step-ms", "20", "--gateway-message-us", str(GW_US[rate]),
          "--network-delay-ms", str(NET_MS)]
    return {"s8": s8, "prompts": s8 + ["--distinct-prompts"],
            "read": s8 + ["--distinct-prompts", "--gateway-read-delay-ms", f"{read_ms:.2f}"]}


def read_ms_of(run: Path) -> float:
    lp = run / "lag_parts.json"
    if lp.exists():
        j = json.loads(lp.read_text())
        return j["outputs O-E"][2] + j["wire+gateway G-O"][2]
    return READ_MS


def main() -> None:
    out_path, runs = sys.argv[1], sys.argv[2:]
    res = []
    pick = os.environ.get("SETTINGS")
    for run in runs:
        run = Path(run)
        rate = (run / "rate.txt").read_text().split()[-2]
        read_ms = read_ms_of(run)
        extra = ["--compete-window"] if run.name.startswith("cw_") else []  # its gateway's flag
        if run.name.startswith("hash_"):  # slo_tie_s10: run with --placement-tie-break hash
            extra += ["--placement-tie-break", "hash"]
        for name, flags in settings(rate, read_ms).items():
            flags = flags + extra
            if pick and name not in pick.split(","):
                continue
            p = subprocess.run([sys.executable, str(HERE / "fid_join.py"), str(run), "--slo-ttft-ms",
                                "fast=750,normal=1000,slow=1600", "--target-throughput", "1",
                                "--min-latency-ms", "600", "--no-idle-flush", *flags],
                               capture_output=True, text=True, check=True)
            d = json.loads(p.stdout.splitlines()[0])
            lt, st = d["ttft_p50_ms_both_live_sim"] or (None, None)  # None: records not joined
            row = {"run": run.name, "rate": rate, "setting": name, "flags": " ".join(flags),
                   "same_decision": d["same_decision"],
                   "same_decision_forced": d["same_decision_forced"],
                   "same_decision_forced_placed": d["same_decision_forced_placed"],
                   "placed_same": d["placed_same"], "num_arrivals": d["num_arrivals"],
                   "refused_live_sim": d["refused_live_sim"],
                   "requests_same_window": d["requests_same_window"], "ttft_p50_live": lt,
                   "ttft_p50_sim": st, "mean_window": d["mean_window"],
                   "ttft_p50_forced_placed_live_sim": d["ttft_p50_ms_forced_placed_live_sim"]}
            res.append(row)
            fp = d["same_decision_forced_placed"]
            ps = d["placed_same"]
            print(f"| {row['run']} | {rate} | {name} | {100 * d['same_decision']:.1f}% | "
                  f"{100 * d['same_decision_forced']:.1f}% | "
                  f"{'-' if fp is None else f'{100 * fp:.1f}%'} | "
                  f"{'-' if ps is None else f'{100 * ps:.0f}%'} | "
                  f"{d['mean_window'][0]:.1f} / {d['mean_window'][1]:.1f} | "                  + (f"{lt:.0f} / {st:.0f} | {100 * (st / lt - 1):+.1f}% |" if lt else "- | - |")
                  + (f" {100 * (tf[1] / tf[0] - 1):+.1f}% |" if (tf := d["ttft_p50_ms_forced_placed_live_sim"])
                     else " - |"),
                  flush=True)
    Path(out_path).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
