#!/usr/bin/env bash
# Issue 35, session 22: the H100 cells of session 21 (../fidelity_grid_h100_s21, pooled as its
# analysis/pool.sh pools them; the 6.7b-fp8 cell with session 18's seeds 0-1) scored in the simulator's
# default form (nocap: --gateway-loop on --plan-lead live) with the schedule's ceiling
# (validate_replay --ceiling 4: both noises, measured on each part's own session). Run from this folder:
#   bash ceiling_h100.sh        (~5 min on 2 cores)
# ceiling_h100_<part>.json/txt, pooled_ceiling_<cell>.md/json, ceiling_h100_summary.md
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S21=../fidelity_grid_h100_s21
S18=../fidelity_grid_h100_s18
rp() {  # dir part out
  [ -f "$3.json" ] && return 0
  $PY -m bench.simulator.validate_replay "$1/$2/validate_$2.json" "$1/$2/decisions_$2.jsonl.gz" "$1/$2/steps_$2.jsonl.gz" \
      --profile "$1/$2/profile_$2.json" --gateway-loop on --plan-lead live --ceiling 4 --json "$3.json" > "$3.txt"
}
rp $S21 6.7b ceiling_h100_6.7b & rp $S21 6.7b-seeds ceiling_h100_6.7b-seeds & wait
rp $S21 6.7b-fp8-seeds ceiling_h100_6.7b-fp8-seeds & rp $S18 6.7b-fp8 ceiling_h100_s18-6.7b-fp8 & wait
rp $S21 6.7b-mixed-2 ceiling_h100_6.7b-mixed-2 & rp $S21 6.7b-mixed-seeds ceiling_h100_6.7b-mixed-seeds & wait
declare -A CELL=(
  [6.7b]="6.7b 6.7b-seeds"
  [6.7b-fp8]="s18-6.7b-fp8 6.7b-fp8-seeds"
  [6.7b-mixed-s21]="6.7b-mixed-2 6.7b-mixed-seeds"
)
for c in 6.7b 6.7b-fp8 6.7b-mixed-s21; do
  files=(); for p in ${CELL[$c]}; do files+=("ceiling_h100_${p}.json"); done
  $PY -m bench.simulator.fidelity_table --pool "${files[@]}" --json "pooled_ceiling_${c}.json" > "pooled_ceiling_${c}.md"
done
$PY - <<'PY' > ceiling_h100_summary.md
import json
from pathlib import Path
print("| cell | simulator | seeds x requests | intervals inside (to 0.95x) | of those outside, kept out by the noise alone (†) | means inside | same chunks 0.5 / 0.8 / 0.95x (%) | their ceiling (%) |")
print("|---|---|---|---|---|---|---|---|")
for c in ("6.7b", "6.7b-fp8", "6.7b-mixed-s21"):
    cells = [x for x in json.loads(Path(f"pooled_ceiling_{c}.json").read_text()) if x["load"] in ("0.5x", "0.8x", "0.95x")]
    figs = [v for x in cells for v in x["figures"].values()]
    chunks = " / ".join(f"{100 * x['same_chunks'][0]:.1f}" for x in cells)
    ceil = " / ".join(f"{100 * x['same_chunks_ceiling']:.1f}" for x in cells)
    print(f"| H100 {c} | nocap | {cells[0]['runs']} | {sum(v['inside'] for v in figs)} / {len(figs)} "
          f"| {sum(bool(v.get('seed_bound')) for v in figs)} "
          f"| {sum(v['mean_inside'] for v in figs)} / {len(figs)} | {chunks} | {ceil} |")
PY
cat ceiling_h100_summary.md
