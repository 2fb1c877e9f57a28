"""Issue 35, session 22: two live runs of one workload (the same seed, the same rates, the same engine
code, two calls) compared as the grid compares the simulator with a live run: the prefill steps with
the same chunks (`decision_fidelity.compare_steps`, requests matched by their arrival order in each
run: the ids differ), and the latency figures (B over A - 1).

Run from the repo root:  python bench/results/fidelity_race_s22/live_vs_live.py PART_A SEED_A PART_B SEED_B
(a part dir holds validate_<part>.json, decisions_<part>.jsonl.gz and steps_<part>.jsonl.gz)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.decision_fidelity import compare_steps
from bench.simulator.fidelity_steps import read_steps
from bench.simulator.session_records import run_arrivals
from bench.simulator.validate import prefill_steps_of
from scheduler.decisions import StepRecord, read_log, step_from_json


def load(part: Path, seed: int):
    tag = part.name
    v = json.loads((part / f"validate_{tag}.json").read_text())
    arrivals, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps = [step_from_json(r) for r in read_steps(part / f"steps_{tag}.jsonl.gz")]
    by_run = run_arrivals(v, arrivals, batches)
    out = {}
    for li, ld in enumerate(v["loads"]):
        for si, run in enumerate(ld["runs"]):
            if int(run["seed"]) != seed:
                continue
            arr = sorted(by_run[(si, li)][0], key=lambda a: a.t)
            out[li] = (ld["load_label"], float(run["rate"]), arr, run["live"],
                       prefill_steps_of(steps, {a.request_id for a in arr}))
    return out


def renamed(steps, names):
    return [StepRecord(s.t, s.num_decodes, tuple((names[c[0]], c[1], c[2]) for c in s.prefill if c[0] in names),
                       s.preempted) for s in steps]


def main(a_dir, a_seed, b_dir, b_seed):
    A, B = load(Path(a_dir), int(a_seed)), load(Path(b_dir), int(b_seed))
    print(f"A = {a_dir} seed {a_seed}; B = {b_dir} seed {b_seed}")
    print("load   rate A / B (req/s)   prompts alike   same chunks %   requests chunked alike %   "
          "TTFT P50 / P99   TPOT P50 / P99   throughput (B / A - 1, %)")
    for li in sorted(A.keys() & B.keys()):
        la, ra, arr_a, live_a, st_a = A[li]
        _lb, rb, arr_b, live_b, st_b = B[li]
        alike = sum(x.num_prompt_tokens == y.num_prompt_tokens for x, y in zip(arr_a, arr_b))
        na = {x.request_id: f"r{i:04d}" for i, x in enumerate(arr_a)}
        nb = {x.request_id: f"r{i:04d}" for i, x in enumerate(arr_b)}
        c = compare_steps(renamed(st_a, na), renamed(st_b, nb))

        def rel(k, q, live_a=live_a, live_b=live_b):
            return 100 * (live_b[k][q] / live_a[k][q] - 1)
        thr = 100 * (live_b["request_throughput"] / live_a["request_throughput"] - 1)
        print(f"{la:>5}  {ra:.4f} / {rb:.4f}   {alike:3d} / {len(arr_a):3d}      {100 * c['same_prefill_step_share']:6.1f}"
              f"          {100 * c['requests_chunked_alike']:6.1f}              "
              f"{rel('ttft_ms', 'p50'):+5.1f} / {rel('ttft_ms', 'p99'):+5.1f}    "
              f"{rel('tpot_ms', 'p50'):+5.1f} / {rel('tpot_ms', 'p99'):+5.1f}    {thr:+5.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
