#!/usr/bin/env bash
# Issue 35, session 15 (H35G): the gateway's event loop in the simulator, scored on the committed H200 logs
# (6.7B: session 14's call, and session 13's as an independent check; 33B: sessions 11 + 13, five seeds), on the CPU. Run from this folder:
#   bash run.sh [terms|6.7b|6.7b-s13|33b|sens|tables]   (default: all; ~3 min for 6.7b, ~1 min for 6.7b-s13, ~3 min for 33b on 2 cores)
# Writes replay_<part>_<steps>_<model>.json/txt (validate_replay: <steps> = live (every live step time fed
# back, a diagnostic: what is left is outside the steps) | asrun (the session's profile); <model> = off
# (today's default) | on (--gateway-loop on) | on_lead (+ --plan-lead live) | lead (--plan-lead live alone)),
# terms_*.txt/json (bench.simulator.gateway_loop: the loop's terms and the timer check; plan_lead),
# table.md (tables.sh).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
S14=../fidelity_grid_h200_s14/6.7b; S11=../fidelity_grid_h200_s11/33b; S13=../fidelity_grid_h200_s13/33b-seeds
A67="$S14/validate_6.7b.json $S14/decisions_6.7b.jsonl.gz $S14/steps_6.7b.jsonl.gz --profile $S14/profile_6.7b.json"
A11="$S11/validate_33b.json $S11/decisions_33b.jsonl.gz $S11/steps_33b.jsonl.gz --profile $S11/profile_33b.json"
S13B=../fidelity_grid_h200_s13/6.7b
A67B="$S13B/validate_6.7b.json $S13B/decisions_6.7b.jsonl.gz $S13B/steps_6.7b.jsonl.gz --profile $S13B/profile_6.7b.json"
A13="$S13/validate_33b-seeds.json $S13/decisions_33b-seeds.jsonl.gz $S13/steps_33b-seeds.jsonl.gz --profile $S13/profile_33b-seeds.json"
flags() { case $1 in off) echo "--gateway-loop off --plan-lead profile" ;; on) echo "--gateway-loop on --plan-lead profile" ;; on_lead) echo "--gateway-loop on --plan-lead live" ;;
                         lead) echo "--gateway-loop off --plan-lead live" ;; esac; }
rp() {  # name args steps model
  local name=$1 args=$2 steps=$3 model=$4 x=""
  [ "$steps" = live ] && x="--live-times"
  # shellcheck disable=SC2046,SC2086
  $PY -m bench.simulator.validate_replay $args $x $(flags "$model") --json replay_${name}_${steps}_${model}.json \
    > replay_${name}_${steps}_${model}.txt
}
if [ "$WHAT" = all ] || [ "$WHAT" = terms ]; then
  $PY -m bench.simulator.gateway_loop $S14/validate_6.7b.json $S14/decisions_6.7b.jsonl.gz $S14/steps_6.7b.jsonl.gz \
    --json terms_6.7b.json > terms_6.7b.txt
  $PY -m bench.simulator.gateway_loop $S11/validate_33b.json $S11/decisions_33b.jsonl.gz $S11/steps_33b.jsonl.gz \
    --json terms_33b-s11.json > terms_33b-s11.txt
  $PY -m bench.simulator.gateway_loop $S13/validate_33b-seeds.json $S13/decisions_33b-seeds.jsonl.gz \
    $S13/steps_33b-seeds.jsonl.gz --json terms_33b-s13.json > terms_33b-s13.txt
  $PY -m bench.simulator.gateway_loop $S13B/validate_6.7b.json $S13B/decisions_6.7b.jsonl.gz $S13B/steps_6.7b.jsonl.gz \
    --json terms_6.7b-s13.json > terms_6.7b-s13.txt
  $PY -m bench.simulator.plan_lead $S14/steps_6.7b.jsonl.gz $S13B/steps_6.7b.jsonl.gz $S11/steps_33b.jsonl.gz \
    $S13/steps_33b-seeds.jsonl.gz > plan_leads.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = 6.7b ]; then
  for m in off on_lead on lead; do rp 6.7b "$A67" live $m & rp 6.7b "$A67" asrun $m & wait; done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = 6.7b-s13 ]; then  # an independent call of the 6.7B (s13: seeds 0-4, the old profile grid)
  rp 6.7b-s13 "$A67B" live off & rp 6.7b-s13 "$A67B" live on_lead & wait
fi
if [ "$WHAT" = all ] || [ "$WHAT" = 33b ]; then
  for s in live asrun; do for m in off on on_lead; do rp 33b-s11 "$A11" $s $m & rp 33b-s13 "$A13" $s $m & wait; done; done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sens ]; then  # sensitivities: the leads' means; the loop's read term 1.5 ms
  $PY -m bench.simulator.validate_replay $A67 --live-times --gateway-loop on --plan-lead live-mean \
    --json sens_6.7b_live_on_leadmean.json > sens_6.7b_live_on_leadmean.txt &
  $PY -m bench.simulator.validate_replay $A67 --live-times --gateway-loop on --plan-lead live --gateway-loop-read-ms 1.5 \
    --json sens_6.7b_live_on_lead_read1.5.json > sens_6.7b_live_on_lead_read1.5.txt &
  wait
  $PY -m bench.simulator.validate_replay $A11 --gateway-loop on --plan-lead live-mean \
    --json sens_33b-s11_asrun_on_leadmean.json > sens_33b-s11_asrun_on_leadmean.txt &
  $PY -m bench.simulator.validate_replay $A13 --gateway-loop on --plan-lead live-mean \
    --json sens_33b-s13_asrun_on_leadmean.json > sens_33b-s13_asrun_on_leadmean.txt &
  wait
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then bash tables.sh; fi
