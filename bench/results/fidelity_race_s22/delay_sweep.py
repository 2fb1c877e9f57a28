"""Issue 35, session 22: is the gateway -> engine delay the replay uses off by a constant? The grid's live
diagnostic (every live step time fed back where the schedules agree, `--live-times --gateway-loop on
--plan-lead live`) with `extra_dispatch_ms` added to the measured delay (the median over requests flushed
while the engine was idle: 9-13 requests a part), same chunks by load. A systematic error in that delay
(a busy engine reads its socket at other moments than an idle one) shows as a peak away from 0.

Run from the repo root:  python bench/results/fidelity_race_s22/delay_sweep.py PART_DIR [MS,MS,...]"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator import validate_replay as vr
from bench.simulator.fidelity_steps import read_steps
from scheduler.decisions import read_log


def main():
    part = Path(sys.argv[1]); tag = part.name
    shifts = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "-1,-0.5,-0.25,0,0.25,0.5,1,2").split(",")]
    validate = json.loads((part / f"validate_{tag}.json").read_text())
    arrivals, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(part / f"steps_{tag}.jsonl.gz")
    print(f"{tag}: same chunks % (mean over seeds) with extra_dispatch_ms added; live step times fed back")
    labels = [ld["load_label"] for ld in validate["loads"]]
    print("extra ms  " + "  ".join(f"{lab:>6}" for lab in labels) + "   TTFT P50 err % by load")
    for ms in shifts:
        rep = vr.replay_session(validate, arrivals, batches, rows, str(part / f"profile_{tag}.json"),
                                gateway_loop=True, live_times=True, plan_lead="live", extra_dispatch_ms=ms)
        same = [100 * ld["steps_path"]["same_prefill_step_share"]["mean"] for ld in rep["loads"]]
        ttft = [100 * ld["summary_replay_path"]["ttft_p50"]["rel_err"]["mean"] for ld in rep["loads"]]
        print(f"{ms:+8.2f}  " + "  ".join(f"{x:6.1f}" for x in same) + "   "
              + " / ".join(f"{x:+.1f}" for x in ttft))


if __name__ == "__main__":
    main()
