#!/usr/bin/env bash
# Issue 35, session 15 (H35P): the cost-model part — decode-graph bucket points and the sustained-load
# trace — scored on the committed H200 logs (fidelity_grid_h200_s14/6.7b, s11/33b, s13/33b-seeds),
# every step a WHAT-IF where it stands in a profile point or a trace the device has not measured.
# Run from this folder: bash run.sh (~3-8 min on the 2-core box; single-threaded steps). Writes:
#   decode_by_d_*.txt               live decode-only steps by batch / bucket against the model
#   whatif_decode_buckets_*.txt     the stand-in decode points (and profile_*_whatif_{firsts,buckets}.json)
#   clock_tau_*.txt                 how fast the live SM clock follows the prefill-busy time (tau)
#   whatif_sustained_trace_*.txt    the stand-in traces (profile_*_trace_*.json): r from the live clock,
#                                   r chosen on seeds 0-1 (fit), the 33B's own back-to-back r
#   step_totals_6.7b_baselines.txt, step_bins_*.txt   the model at every live step, by busy share
#   replay_*.txt/json, table_*.md   validate_replay with each profile (as run = today's simulator)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd); PY=${PY:-$ROOT/.venv/bin/python}; export PYTHONPATH=$ROOT
S14=../fidelity_grid_h200_s14; R=$S14/6.7b; A=$S14/analysis
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# 1. decode points at the buckets' first batches (stand-ins from live step ratios)
$PY whatif_decode_buckets.py $R/profile_6.7b.json $R/steps_6.7b.jsonl.gz $R/decisions_6.7b.jsonl.gz \
  profile_6.7b_whatif_firsts.json > whatif_decode_buckets_6.7b.txt
$PY whatif_decode_buckets.py $A/profile_6.7b_sustained_whatif.json $R/steps_6.7b.jsonl.gz $R/decisions_6.7b.jsonl.gz \
  profile_6.7b_whatif_firsts_sustained.json > /dev/null
$PY decode_by_d.py $R 6.7b > decode_by_d_6.7b_asrun.txt
$PY decode_by_d.py $R 6.7b profile_6.7b_whatif_firsts.json > decode_by_d_6.7b_whatif_firsts.txt
for x in s11:33b s13:33b-seeds; do
  IFS=: read -r s t <<<"$x"; Q=../fidelity_grid_h200_$s/$t
  $PY decode_by_d.py $Q $t > decode_by_d_${t}_${s}_asrun.txt
  for n in firsts buckets; do
    $PY whatif_decode_buckets.py $Q/profile_$t.json $Q/steps_$t.jsonl.gz $Q/decisions_$t.jsonl.gz \
      profile_${t}_${s}_whatif_$n.json $([ $n = buckets ] && echo --no-firsts) > whatif_decode_buckets_${t}_${s}_$n.txt
    $PY decode_by_d.py $Q $t profile_${t}_${s}_whatif_$n.json > decode_by_d_${t}_${s}_whatif_$n.txt
  done
  # 2. the live clock's time constant
  $PY clock_tau.py $Q/smi_$t.csv.gz $Q/steps_$t.jsonl.gz > clock_tau_${t}_$s.txt
done
$PY clock_tau.py $R/smi_6.7b.csv.gz $R/steps_6.7b.jsonl.gz > clock_tau_6.7b_s14.txt
# 3. the sustained trace stood in (6.7B: tau 0.5 s from the live clock; r from the clock, or chosen on seeds 0-1)
$PY whatif_sustained_trace.py $R profile_6.7b_whatif_firsts.json 0.5 clock:1980:1860 0,1 \
  profile_6.7b_whatif_firsts_trace_clock.json > whatif_sustained_trace_clock.txt
$PY whatif_sustained_trace.py $R profile_6.7b_whatif_firsts.json 0.5 fit 0,1 \
  profile_6.7b_whatif_firsts_trace_fit.json > whatif_sustained_trace_fit.txt
for pr in $R/profile_6.7b.json profile_6.7b_whatif_firsts.json $A/profile_6.7b_sustained_whatif.json \
    profile_6.7b_whatif_firsts_sustained.json; do
  echo "== $pr"; $PY whatif_sustained_trace.py $R $pr 0.5 none 0,1 "$TMP/none.json"
done > step_totals_6.7b_baselines.txt
$PY step_bins.py $R $R/profile_6.7b.json $A/profile_6.7b_sustained_whatif.json profile_6.7b_whatif_firsts_sustained.json \
  profile_6.7b_whatif_firsts_trace_clock.json profile_6.7b_whatif_firsts_trace_fit.json > step_bins_6.7b.txt
# 4. replays: today's simulator as run (baselines), then each what-if (held-out seeds 2-4 where r was chosen on 0-1)
bash run_baselines.sh
rp() { $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_6.7b.json $R/decisions_6.7b.jsonl.gz $R/steps_6.7b.jsonl.gz \
         --profile $1.json ${2:+--seeds $2} --json replay_$3.json > replay_$3.txt; }
rp profile_6.7b_whatif_firsts "" 6.7b_whatif_firsts
rp profile_6.7b_whatif_firsts_sustained 2,3,4 6.7b_whatif_firsts_sustained_heldout
rp profile_6.7b_whatif_firsts_trace_clock 2,3,4 6.7b_whatif_firsts_trace_clock_heldout
rp profile_6.7b_whatif_firsts_trace_fit 2,3,4 6.7b_whatif_firsts_trace_fit_heldout
# ... and with H35G's gateway loop and live plan lead (opt-in, 416abcf): the two parts of issue 35 together
for x in trace_clock trace_fit; do
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_6.7b.json $R/decisions_6.7b.jsonl.gz $R/steps_6.7b.jsonl.gz \
    --profile profile_6.7b_whatif_firsts_$x.json --seeds 2,3,4 --gateway-loop on --plan-lead live \
    --json replay_6.7b_whatif_firsts_${x}_heldout_gwloop.json > replay_6.7b_whatif_firsts_${x}_heldout_gwloop.txt
done
for f in 6.7b_asrun 6.7b_asrun_heldout 6.7b_whatif_firsts 6.7b_whatif_firsts_sustained_heldout \
    6.7b_whatif_firsts_trace_clock_heldout 6.7b_whatif_firsts_trace_fit_heldout \
    6.7b_whatif_firsts_trace_clock_heldout_gwloop 6.7b_whatif_firsts_trace_fit_heldout_gwloop; do
  $PY -m bench.simulator.fidelity_table replay_$f.json > table_$f.md
done
# 5. the 33B: decode points + trace (tau 0.2 s, r = the call's own back to back), both calls pooled
bash run_33b_trace.sh
TAU=0.2 $PY step_bins.py ../fidelity_grid_h200_s11/33b ../fidelity_grid_h200_s11/33b/profile_33b.json \
  profile_33b_s11_whatif_buckets.json profile_33b_s11_whatif_firsts.json profile_33b_s11_whatif_firsts_trace.json \
  > step_bins_33b_s11.txt
echo done
