#!/usr/bin/env bash
# Issue 35, session 21: the mixed steps' spread term as a what-if on session 20's H200 mixed-lengths
# parts, whose profiles have no mixed spread points (`validate_replay --mixed-spread KAPPA`): the
# prediction for the next H200 mixed-lengths calls, which will measure the points. The H100's
# profiles read kappa 4-6.6 at d 4-128; the decode-only kappas read ~3 on the H100 and 1.0-1.9 on the
# H200, so the H200's mixed kappa is not known: three values. Simulator default form (no
# --cap-by-power) and the cap form. Run from this folder (~4 min on 2 cores):
#   bash mixed_whatif_h200.sh  -> mixed_whatif_h200_<part>.txt
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S20=../../fidelity_grid_h200_s20
for p in 6.7b-mixed 33b-mixed; do
  d=$S20/$p
  one() {  # label, extra flags
    local label=$1; shift
    # shellcheck disable=SC2068
    $PY -m bench.simulator.validate_replay $d/validate_$p.json $d/decisions_$p.jsonl.gz $d/steps_$p.jsonl.gz \
        --profile $d/profile_$p.json --gateway-loop on --plan-lead live $@ > "/tmp/mwh_${p}_$label.txt"
  }
  one off --mixed-spread off & one k2 --mixed-spread 2 & wait
  one k3 --mixed-spread 3 & one k5 --mixed-spread 5 & wait
  one cap_off --cap-by-power --mixed-spread off & one cap_k3 --cap-by-power --mixed-spread 3 & wait
  for label in off k2 k3 k5 cap_off cap_k3; do
    echo "== $p, mixed spread $label"
    grep -E "^ *(0.5|0.8|0.95|1.2)x" "/tmp/mwh_${p}_$label.txt" | sed -E "s/; window late.*//"
  done > "mixed_whatif_h200_$p.txt"
done
