"""Issue 35, session 21: the first live prefill steps whose chunks no simulated step has (every
live step time fed back), each beside the simulated steps that hold its requests' chunks:
"id:tokens@position/prompt length". Run from the repo root:
    python chunk_diff.py PART_DIR SEED LOAD [HOW_MANY]"""
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import sims.decision_replay as dr
from bench.simulator import validate_replay as vr
from bench.simulator.fidelity_steps import read_steps
from bench.simulator.validate import prefill_steps_of
from scheduler.decisions import read_log, step_from_json

part = Path(sys.argv[1]); seed = int(sys.argv[2]); load = sys.argv[3]; tag = part.name
caught = []
orig = dr.replay_run
def wrap(arr, *a, **k):
    res, b = orig(arr, *a, **k); caught.append((arr, res)); return res, b
dr.replay_run = wrap
validate = json.loads((part / f"validate_{tag}.json").read_text())
arrivals, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
rows = read_steps(part / f"steps_{tag}.jsonl.gz")
vr.replay_session(validate, arrivals, batches, rows, str(part / f"profile_{tag}.json"), seeds={seed},
                  cap_by_power=True, gateway_loop=True, live_times=True, plan_lead="live")
runs = [(li, ld["load_label"]) for li, ld in enumerate(validate["loads"]) for r in ld["runs"] if int(r["seed"]) == seed]
live_all = [step_from_json(r) for r in rows]
for (li, lab), (arr, res) in zip(runs, caught):
    if lab != load: continue
    ids = {a.request_id for a in arr}
    plen = {a.request_id: a.num_prompt_tokens for a in arr}
    L = prefill_steps_of(live_all, ids); S = prefill_steps_of(dr.step_records(res, arr), ids)
    sl = Counter(frozenset(s.prefill) for s in S)
    shown = 0
    for k, s in enumerate(L):
        if sl[frozenset(s.prefill)] > 0: continue
        # the sim steps holding any of these requests' chunks
        rq = {c[0] for c in s.prefill}
        sim_of = [x for x in S if any(c[0] in rq for c in x.prefill)]
        print(f"live step {k} d={s.num_decodes}: " + ", ".join(f"{c[0][-6:]}:{c[1]}@{c[2]}/{plen[c[0]]}" for c in s.prefill))
        for x in sim_of[:3]:
            print(f"    sim d={x.num_decodes}: " + ", ".join(f"{c[0][-6:]}:{c[1]}@{c[2]}/{plen.get(c[0], -1)}" for c in x.prefill))
        shown += 1
        if shown >= int(sys.argv[4] if len(sys.argv) > 4 else 8): break
