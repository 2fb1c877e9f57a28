#!/usr/bin/env bash
# Issue 35, session 21: the H100's 6.7B grid, five seeds a cell. Session 18's H100 call ran seeds 0-1
# of 6.7b-fp8 and 6.7b-mixed (../../fidelity_grid_h100_s18); this session's five H100 calls ran the
# rest (../6.7b: seeds 0-2, ../6.7b-seeds: 3-4, ../6.7b-fp8-seeds: 2-4, ../6.7b-mixed-2: 2,
# ../6.7b-mixed-seeds: 3-4). Each part is scored with its own call's profile, at this HEAD, in run.sh's
# forms (default = the grid state's model with --cap-by-power; nocap = without it), and the runs of one
# cell are pooled (`fidelity_table --pool`). Run after `bash run.sh replays`, from this folder:
#   bash pool.sh        (~3 min on 2 cores: the two s18 parts are re-scored here)
# pooled_<cell>_<form>.md / .json: the cell's table (<cell>-s21: this session's parts alone; for the
# mixed lengths also nomixed: nocap without the mixed-step spread term, and nospread: run.sh's);
# pooled_summary.md: one line a cell and form. The nocap form is the simulator's own default.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S18=../../fidelity_grid_h100_s18
flags() { case $1 in default) echo "--cap-by-power --gateway-loop on --plan-lead live" ;;
                         nocap) echo "--gateway-loop on --plan-lead live" ;; esac; }
for p in 6.7b-fp8 6.7b-mixed; do
  for form in default nocap; do
    out=replay_s18-${p}_asrun_${form}
    [ -f "$out.json" ] && continue
    # shellcheck disable=SC2046
    $PY -m bench.simulator.validate_replay $S18/$p/validate_$p.json $S18/$p/decisions_$p.jsonl.gz \
        $S18/$p/steps_$p.jsonl.gz --profile $S18/$p/profile_$p.json $(flags $form) --json "$out.json" > "$out.txt" &
  done
  wait
done
declare -A CELL=(
  [6.7b]="6.7b 6.7b-seeds"
  [6.7b-fp8]="s18-6.7b-fp8 6.7b-fp8-seeds"
  [6.7b-mixed]="s18-6.7b-mixed 6.7b-mixed-2 6.7b-mixed-seeds"
  # this session's profiles only: session 18's lack the spread points (kappa unmeasured), the drawn
  # lengths' contexts and the mixed step's sustained run, which the model reads
  [6.7b-fp8-s21]="6.7b-fp8-seeds"
  [6.7b-mixed-s21]="6.7b-mixed-2 6.7b-mixed-seeds"
)
for c in 6.7b 6.7b-fp8 6.7b-fp8-s21 6.7b-mixed 6.7b-mixed-s21; do
  for form in default nocap; do
    files=(); for p in ${CELL[$c]}; do files+=("replay_${p}_asrun_${form}.json"); done
    $PY -m bench.simulator.fidelity_table --pool "${files[@]}" --json "pooled_${c}_${form}.json" > "pooled_${c}_${form}.md"
  done
done
# the mixed lengths, this session's profiles: the model's default without this session's mixed-step
# spread term (--mixed-spread off; sims.profile_cost, "Unequal contexts beside a chunk") and without
# the decode-only one (nospread, run.sh), for the before / after
for p in 6.7b-mixed-2 6.7b-mixed-seeds; do
  [ -f "replay_${p}_asrun_nomixed.json" ] && continue
  # shellcheck disable=SC2046
  $PY -m bench.simulator.validate_replay ../$p/validate_$p.json ../$p/decisions_$p.jsonl.gz ../$p/steps_$p.jsonl.gz \
      --profile ../$p/profile_$p.json $(flags nocap) --mixed-spread off --json "replay_${p}_asrun_nomixed.json" \
      > "replay_${p}_asrun_nomixed.txt" &
done
wait
for form in nomixed nospread; do
  $PY -m bench.simulator.fidelity_table --pool replay_6.7b-mixed-2_asrun_${form}.json replay_6.7b-mixed-seeds_asrun_${form}.json \
      --json "pooled_6.7b-mixed-s21_${form}.json" > "pooled_6.7b-mixed-s21_${form}.md"
done
$PY - <<'PY' > pooled_summary.md
import json
from pathlib import Path
print("| cell | simulator | seeds x requests | intervals inside (to 0.95x) | means inside | same chunks 0.5 / 0.8 / 0.95x (%) |")
print("|---|---|---|---|---|---|")
for c in ("6.7b", "6.7b-fp8", "6.7b-fp8-s21", "6.7b-mixed", "6.7b-mixed-s21"):
    for form in ("default", "nocap") + (("nomixed", "nospread") if c == "6.7b-mixed-s21" else ()):
        cells = [x for x in json.loads(Path(f"pooled_{c}_{form}.json").read_text()) if x["load"] in ("0.5x", "0.8x", "0.95x")]
        figs = [v for x in cells for v in x["figures"].values()]
        chunks = " / ".join(f"{100 * x['same_chunks'][0]:.1f}" for x in cells)
        print(f"| H100 {c} | {form} | {cells[0]['runs']} | {sum(v['inside'] for v in figs)} / {len(figs)} "
              f"| {sum(v['mean_inside'] for v in figs)} / {len(figs)} | {chunks} |")
PY
cat pooled_summary.md
