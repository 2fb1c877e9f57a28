#!/usr/bin/env bash
# Issue 35, session 19: decode steps of unequal contexts (sims/decode_spread.py). CPU only, from this
# folder (~4 min on 2 cores):
#   bash run.sh
# bins_<part>.txt: spread_bins.py (decode-only steps by d and max / mean context, model / live without
#   the term and with what-if kappas); replay_6.7b-mixed-h100_<kappa>.json/txt: validate_replay of the
#   H100 mixed part (session 18, seeds 0-1) in the grid state's default form (gateway loop, measured
#   plan leads, --cap-by-power) with --decode-spread off / KAPPA (what-ifs: its profile has no spread
#   points; kappa 2.5 was read off these same steps, so these are not out-of-sample results).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
H=../fidelity_grid_h100_s18
$PY spread_bins.py $H/6.7b-mixed 2.0 2.5 3.0 > bins_6.7b-mixed-h100.txt
$PY spread_bins.py $H/6.7b-fp8 2.5 > bins_6.7b-fp8-h100.txt
$PY spread_bins.py ../fidelity_grid_h200_s16/6.7b 2.5 > bins_6.7b-h200-s16.txt
P=6.7b-mixed
for k in off 2.0 2.5 3.0; do
  $PY -m bench.simulator.validate_replay $H/$P/validate_$P.json $H/$P/decisions_$P.jsonl.gz $H/$P/steps_$P.jsonl.gz \
      --profile $H/$P/profile_$P.json --gateway-loop on --plan-lead live --cap-by-power --decode-spread $k \
      --json replay_6.7b-mixed-h100_$k.json > replay_6.7b-mixed-h100_$k.txt &
  [ "$k" = 2.0 ] && wait
done
wait
for k in off 2.0 2.5 3.0; do
  $PY -m bench.simulator.fidelity_table replay_6.7b-mixed-h100_$k.json > table_6.7b-mixed-h100_$k.md
done
# the term end to end on a profile with (synthetic) spread points: kappa read back, the default replay
$PY pipeline_check.py /tmp/spread_pipeline > pipeline_check.txt
T=/tmp/spread_pipeline/$P
$PY -m bench.simulator.validate_replay $T/validate_$P.json $T/decisions_$P.jsonl.gz $T/steps_$P.jsonl.gz \
    --profile $T/profile_$P.json --gateway-loop on --plan-lead live --cap-by-power >> pipeline_check.txt
