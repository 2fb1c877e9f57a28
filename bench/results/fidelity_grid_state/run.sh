#!/usr/bin/env bash
# Issue 35: the fidelity grid as it stands — every committed H200 grid part, and the H100 parts on the
# conditioned profile (session 33 on: the profiles whose decode points read right), re-scored at this HEAD
# with the simulator's default form (`validate_replay`'s defaults: the gateway loop and the measured
# plan leads, and since session 25 the power-by-kind cap where a part's profile carries the pause check's
# "sustained_mixed" run), one table a reader can use (table.md). For those parts the model without the
# weights (`--cap-by-power off`, the default before session 25) is scored beside it. Run from
# this folder (CPU only, ~60 min on 2 cores with the ceiling at 8 draws a run, a few without: CEILING=0; `PARTS="33b 6.7b-s16"` for some):
#   bash run.sh [replays|tables]      (default both; tables also writes summary.md: summary.py)
# replay_<part>_<form>.json/txt: validate_replay; <form> = default | nocap
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
G=..
# draws of the engine's own noise per run (validate_replay --ceiling: the same-chunks ceiling); 0: none.
# 8 since session 23: with 4 a reseed alone moved a cell's 0.95x ceiling by up to ~3-6 points
CEILING=${CEILING:-8}
# part name -> "session folder/part" (the call that measured it)
declare -A SRC=(
  [33b-s11]=fidelity_grid_h200_s11/33b            # 33B bf16, seeds 0-2 (pooled with s13's 3-4: five seeds)
  [33b-s13]=fidelity_grid_h200_s13/33b-seeds      # 33B bf16, seeds 3-4
  [6.7b-s13]=fidelity_grid_h200_s13/6.7b
  [6.7b-s14]=fidelity_grid_h200_s14/6.7b
  [6.7b-s16]=fidelity_grid_h200_s16/6.7b          # the first 6.7B profile with the sustained run
  [6.7b-fp8-s16]=fidelity_grid_h200_s16/6.7b-fp8
  [33b-fp8-s16]=fidelity_grid_h200_s16/33b-fp8
  [33b-fp8-s17]=fidelity_grid_h200_s17/33b-fp8    # the first profile with the mixed step's sustained run
  [6.7b-mixed-s20]=fidelity_grid_h200_s20/6.7b-mixed  # mixed lengths; the first profiles with spread points
  [33b-kvint4-s20]=fidelity_grid_h200_s20/33b-kvint4  # int4-fp8 KV, seeds 0-1
  [33b-mixed-s20]=fidelity_grid_h200_s20/33b-mixed    # mixed lengths, seed 0
  [6.7b-mixed-s25]=fidelity_grid_h200_s25/6.7b-mixed-seeds        # mixed lengths, seeds 0-3
  [6.7b-mixed-s25-4]=fidelity_grid_h200_s25/seed4/6.7b-mixed-seeds  # seed 4, the same profile (PROFILE_FROM)
  [33b-mixed-s25-1]=fidelity_grid_h200_s25/33b-mixed-1    # mixed lengths, seed 1
  [33b-mixed-s25-2]=fidelity_grid_h200_s25/33b-mixed-2    # seeds 2-3, the same profile (PROFILE_FROM)
  # H100 parts (session 36 added them): the conditioned profile from session 33 on; the older H100 parts
  # (sessions 18-31) are read in their own folders
  [h100-6.7b-fp8-s33]=conditioned_s33/h100_6.7b-fp8/6.7b-fp8   # seeds 0-4, no tile-edge pairs
  [h100-6.7b-fp8-s35]=tiles_s35/h100_6.7b-fp8/6.7b-fp8         # seeds 0-4, the first pairs (two twins)
  [h100-6.7b-s34]=tiles_s34/h100_6.7b/6.7b                     # seeds 0-3, off-edge points (recorded only)
  [h100-6.7b-s35]=tiles_s35/h100_6.7b/6.7b                     # seeds 0-1, pairs (two twins)
  [h100-6.7b-mixed-s35]=tiles_s35/h100_6.7b-mixed/6.7b-mixed   # mixed lengths, seeds 0-2, off-edge points
  # session 38: the first 33B parts on an H100 scored on the current profiler (pairs with the next twin)
  [h100-33b-fp8-s38]=pairs_s38/h100_33b-fp8/33b-fp8            # seeds 0-4 on session 36's H100 profile (PROFILE_FROM)
  [h100-33b-kvint4-s38]=pairs_s38/h100_33b-kvint4/33b-kvint4   # bf16 weights, int4-fp8 KV: seeds 0-1 + the profile
  [h100-33b-kvint4-s38-2]=pairs_s38/h100_33b-kvint4-seeds2-4/33b-kvint4  # seeds 2-4, the same profile
  [h100-6.7b-s38]=pairs_s38/h100_6.7b-seeds1-2/6.7b            # seeds 1-2 on session 37's H100 profile
  # session 39: the issue's first cell (33B bf16, bf16 KV) on an H100 and the current profiler
  [h100-33b-s39]=pairs_s39/h100_33b/33b-seeds0-1/33b           # seeds 0-1 + the profile (the sixth run cut)
  [h100-33b-s39-2]=pairs_s39/h100_33b/33b-seeds2-4/33b         # seeds 2-4, the same profile (the check passed)
  # session 40: the H100 6.7B bf16 at five seeds on its own profile; the 33B bf16's seed 0 again on a new profile
  # (a repeat of s39's seed 0, not a sixth seed: scored alone, never pooled with it)
  [h100-6.7b-s40]=pairs_s40/h100_6.7b/6.7b-seeds0-4/6.7b         # seeds 0-4 + the profile (the first hot patterns)
  [h100-33b-s40]=pairs_s40/h100_33b/33b-seed0/33b               # seed 0 + the profile (hot patterns)
  # session 41: seeds 5-8 asked on the s36 / s38 profiles; the check found each card off (decode -2.4 / -3.7 %), so
  # each call measured its own profile and ran what was left: seeds 5-7 (FP8), 5-6 (int4-fp8 KV; 0.95x seed 5 only)
  [h100-33b-fp8-s41]=pairs_s41/h100_33b-fp8/33b-fp8             # seeds 5-7 + the profile (its own: the check failed)
  [h100-33b-kvint4-s41]=pairs_s41/h100_33b-kvint4/33b-kvint4    # seeds 5-6 + the profile (the same)
)
ORDER="33b-s11 33b-s13 6.7b-s13 6.7b-s14 6.7b-s16 6.7b-fp8-s16 33b-fp8-s16 33b-fp8-s17 6.7b-mixed-s20 33b-kvint4-s20 33b-mixed-s20
       6.7b-mixed-s25 6.7b-mixed-s25-4 33b-mixed-s25-1 33b-mixed-s25-2
       h100-6.7b-fp8-s33 h100-6.7b-fp8-s35 h100-6.7b-s34 h100-6.7b-s35 h100-6.7b-mixed-s35
       h100-33b-fp8-s38 h100-33b-kvint4-s38 h100-33b-kvint4-s38-2 h100-6.7b-s38 h100-33b-s39 h100-33b-s39-2
       h100-6.7b-s40 h100-33b-s40 h100-33b-fp8-s41 h100-33b-kvint4-s41"
PARTS=${PARTS:-$ORDER}
args() { local d=$G/${SRC[$1]} p=${SRC[$1]##*/}
  echo "$d/validate_$p.json $d/decisions_$p.jsonl.gz $d/steps_$p.jsonl.gz --profile $d/profile_$p.json"; }
has_mixed() { local d=$G/${SRC[$1]} p=${SRC[$1]##*/}
  grep -q '"sustained_mixed"' "$d/profile_$p.json"; }
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  for p in $PARTS; do
    echo "$(date -u +%H:%M:%S) $p" >&2
    # shellcheck disable=SC2046
    $PY -m bench.simulator.validate_replay $(args "$p") --ceiling "$CEILING" --json "replay_${p}_default.json" \
        > "replay_${p}_default.txt"
    if has_mixed "$p"; then
      # shellcheck disable=SC2046
      $PY -m bench.simulator.validate_replay $(args "$p") --cap-by-power off --ceiling "$CEILING" --json "replay_${p}_nocap.json" \
          > "replay_${p}_nocap.txt"
    fi
    if [ "${p#h100-}" != "$p" ] && [ "${DELAY:-on}" = on ]; then
      # session 41: the delayed onset (opt-in, sims.profile_cost "The delayed onset"), on the H100 parts (the
      # H200 profiles lack its runs: there it is the default); DELAY=off skips it
      # shellcheck disable=SC2046
      $PY -m bench.simulator.validate_replay $(args "$p") --cap-onset delay --ceiling "$CEILING" \
          --json "replay_${p}_delay.json" > "replay_${p}_delay.txt"
    fi
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  {
    echo "### The 33B bf16, five seeds (s11 seeds 0-2 + s13 seeds 3-4, pooled), default"
    echo
    $PY -m bench.simulator.fidelity_table --pool replay_33b-s11_default.json replay_33b-s13_default.json \
        --json table_33b-5seeds_default.json
    for form in default nocap; do  # the parts measured over several calls of one profile, pooled
      [ -f "replay_6.7b-mixed-s25_${form}.json" ] || continue
      echo
      echo "### 6.7b-mixed-s25-5seeds (seeds 0-3 + seed 4 of one profile, pooled), $form"
      echo
      $PY -m bench.simulator.fidelity_table --pool "replay_6.7b-mixed-s25_${form}.json" \
          "replay_6.7b-mixed-s25-4_${form}.json" --json "table_6.7b-mixed-s25-5seeds_${form}.json"
      echo
      echo "### 33b-mixed-s25-3seeds (seed 1 + seeds 2-3 of one profile, pooled), $form"
      echo
      $PY -m bench.simulator.fidelity_table --pool "replay_33b-mixed-s25-1_${form}.json" \
          "replay_33b-mixed-s25-2_${form}.json" --json "table_33b-mixed-s25-3seeds_${form}.json"
    done
    # the H100 cells pooled over the calls on the conditioned profile (each seed replayed on its own call's profile:
    # the machine-to-machine spread is part of what a user of the simulator meets)
    pool() {  # name "what" parts...: the default form, and the delayed onset where every part has it
      local name=$1 what=$2; shift 2
      local form files q
      for form in default delay; do
        files=()
        for q in "$@"; do [ -f "replay_${q}_${form}.json" ] && files+=("replay_${q}_${form}.json"); done
        [ ${#files[@]} -ge 2 ] && [ ${#files[@]} -eq $# ] || continue
        echo
        echo "### $name ($what), $form"
        echo
        $PY -m bench.simulator.fidelity_table --pool "${files[@]}" --json "table_${name}_${form}.json"
      done
    }
    pool h100-6.7b-fp8-10seeds "H100: s33 seeds 0-4 + s35 seeds 0-4, two profiles" h100-6.7b-fp8-s33 h100-6.7b-fp8-s35
    pool h100-6.7b-6seeds "H100: s34 seeds 0-3 + s35 seeds 0-1, two profiles" h100-6.7b-s34 h100-6.7b-s35
    pool h100-6.7b-8seeds "H100: s34 seeds 0-3 + s35 seeds 0-1 + s38 seeds 1-2, three profiles" h100-6.7b-s34 \
        h100-6.7b-s35 h100-6.7b-s38
    pool h100-33b-kvint4-5seeds "H100: s38 seeds 0-1 + seeds 2-4, one profile" h100-33b-kvint4-s38 h100-33b-kvint4-s38-2
    pool h100-33b-5seeds "H100: s39 seeds 0-1 + seeds 2-4, one profile" h100-33b-s39 h100-33b-s39-2
    # session 40: runs, not seeds — s40 repeats seeds on new profiles (the 6.7B's 0-4, the 33B's 0); a repeated
    # seed's runs share a workload, so these intervals lean narrow; the engine's call-to-call scatter is in them
    pool h100-6.7b-13runs "H100: s34 seeds 0-3 + s35 0-1 + s38 1-2 + s40 0-4, four profiles" h100-6.7b-s34 \
        h100-6.7b-s35 h100-6.7b-s38 h100-6.7b-s40
    pool h100-33b-6runs "H100: s39 seeds 0-4 + s40 seed 0 again, two profiles" h100-33b-s39 h100-33b-s39-2 h100-33b-s40
    # session 41: new seeds (5-8), so these pool seeds, not repeats; each call on its own card's profile
    pool h100-33b-fp8-8seeds "H100: s38 seeds 0-4 (s36 profile) + s41 seeds 5-7 (own profile), two profiles" \
        h100-33b-fp8-s38 h100-33b-fp8-s41
    pool h100-33b-kvint4-7seeds "H100: s38 seeds 0-4 + s41 seeds 5-6 (0.95x: seed 5 only), two profiles" \
        h100-33b-kvint4-s38 h100-33b-kvint4-s38-2 h100-33b-kvint4-s41
    for p in 6.7b-s13 6.7b-s14 6.7b-s16 6.7b-fp8-s16 33b-fp8-s16 33b-fp8-s17 6.7b-mixed-s20 33b-kvint4-s20 33b-mixed-s20 \
             h100-6.7b-fp8-s33 h100-6.7b-fp8-s35 h100-6.7b-s34 h100-6.7b-s35 h100-6.7b-mixed-s35 \
             h100-33b-fp8-s38 h100-33b-kvint4-s38 h100-33b-kvint4-s38-2 h100-6.7b-s38 h100-33b-s39 h100-33b-s39-2 \
             h100-6.7b-s40 h100-33b-s40 h100-33b-fp8-s41 h100-33b-kvint4-s41; do
      for form in default nocap delay; do
        [ -f "replay_${p}_${form}.json" ] || continue
        echo
        echo "### $p (${SRC[$p]}), $form"
        echo
        $PY -m bench.simulator.fidelity_table "replay_${p}_${form}.json" --json "table_${p}_${form}.json"
      done
    done
  } > table.md
  $PY summary.py > summary.md
fi
