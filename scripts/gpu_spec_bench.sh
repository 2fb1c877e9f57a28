#!/usr/bin/env bash
# Issue 28's H200 goals, the benchmark part (run by scripts/gpu_spec_run.sh, or alone). Two
# parts, one device call each (each fits the 10-minute limit):
#
#   PART=serve  tidegate serve (33B preset, dummy bf16 weights, speculation on by default), then
#               1. oracle edit, c=1, 100/75/50% of lines kept   goal: TPOT p50 <= 0.30/0.45/0.65x
#               2. oracle edit, c=8, 100%                        goal: <= 0.5x
#                  (each against its own greedy baseline with speculation off, same invocation)
#               3. saturation: 512/128 x 400 at once and 16/32 x 256 at once, the requests'
#                  speculation left to the server's policy vs "off"   goal: tok/s >= 0.98x
#               4. oracle edit at 3 loads (c = LOADS) with 75% kept, traces for the simulator
#   PART=sim    the verify-shaped profile (tidegate backend profile: short chunks at a context,
#               packed ones for concurrent verifies), the simulator on part 4's traces at the
#               same loads, and sim vs live (bench.simulator.spec_validate)   goal: within 5%
#               and the same policy decisions. Needs part serve's $OUT/spec_serve.tar.gz.
#
#   bash scripts/gpu_spec_bench.sh                      # PART=serve, writes under $OUT
#   PART=sim bash scripts/gpu_spec_bench.sh
#   MODEL=tiny LOAD_FORMAT=dummy DEVICE=cpu NREQ=2 OUTLEN=24 SAT="64/8x16" LOADS="1 2" FILE_CHARS=600 \
#       bash scripts/gpu_spec_bench.sh                  # the CPU check (then PART=sim with
#                                                       # PROFILE_CONTEXTS=256 for a small model)
#
# Weights: LOAD_FORMAT (dummy-cycle): random weights whose greedy output walks a fixed token
# cycle (backend.model.loader.init_dummy_weights): the same shapes and kernel times as `dummy`,
# but no near-tied logits, so the oracle's prediction (one greedy run's output) stays exact when
# the next run verifies it in other step shapes; with `dummy` the bf16 outputs parted from the
# baseline after 3-12 tokens (BENCHMARKS, "Speculation on the H200").
# The server writes its step log (drafts per step) to serve/steps.jsonl.
# Environment: MODEL (deepseek-coder-33b), DEVICE (cuda), PART (serve | sim), OUT (out/gpu_spec),
# NREQ (requests per oracle run, 8), OUTLEN (tokens per request, 256), SAT (saturation workloads
# "IN/OUTxN ...", "512/128x400 16/32x256"), LOADS (concurrencies of the sim-vs-live runs,
# "1 8 32"; "" for none), EDIT (1; 0 skips runs 1 and 2), SAT_MODES (the saturation runs' order, "auto off auto off"), PORT (18080), FILE_CHARS (characters of code per prompt, 3000), DEADLINE_S (part
# serve starts nothing new after it, 480, and stops a run still going at LIMIT_S, 560; what it
# skipped is listed in skipped.txt), SERVE_TAR
# (part sim: part serve's tarball when this machine no longer holds its results). Outputs: $OUT/spec_serve_table.txt, $OUT/spec_serve.tar.gz (part
# serve); $OUT/spec_sim_table.txt, $OUT/spec_sim.tar.gz (part sim).
set -u
OUT=${OUT:-out/gpu_spec}
MODEL=${MODEL:-deepseek-coder-33b}
LOAD_FORMAT=${LOAD_FORMAT:-dummy-cycle}
EDIT=${EDIT:-1}  # 0: part serve skips the oracle edit runs (1, 2)
DEVICE=${DEVICE:-cuda}
PART=${PART:-serve}
NREQ=${NREQ:-8}
OUTLEN=${OUTLEN:-256}
SAT=${SAT-"512/128x400 16/32x256"}  # "" skips the saturation runs
LOADS=${LOADS-"1 8 32"}
PORT=${PORT:-18080}
FILE_CHARS=${FILE_CHARS:-3000}
DEADLINE_S=${DEADLINE_S:-480}  # part serve starts no new run after this many seconds
LIMIT_S=${LIMIT_S:-560}  # and stops a run still going then (the device call ends at 600 s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
if ! $PY -c 'import zmq' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
W=${WORK:-/tmp/spec_work}  # outside $OUT: only a few files come back
mkdir -p "$OUT" "$W"
URL="http://127.0.0.1:$PORT"
late() { [ "$SECONDS" -ge "$DEADLINE_S" ] && echo "deadline ($DEADLINE_S s): skipping $1" | tee -a "$W/skipped.txt"; }
bench() {  # a run, stopped at LIMIT_S whatever happens, so that the results still get packed
  local left=$((LIMIT_S - SECONDS))
  [ "$left" -ge 20 ] || { echo "no time left for: $*" >> "$W/skipped.txt"; return 1; }
  timeout "$((left < 300 ? left : 300))" $PY -m gateway.tidegate_cli bench serve --url "$URL" \
      --model "$(basename "$MODEL")" --file-chars "$FILE_CHARS" "$@"; }  # (a directory's served name)

if [ "$PART" = serve ]; then
  rm -rf "$W/serve" "$W/skipped.txt"; mkdir -p "$W/serve"; S=$W/serve
  { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
    git log -1 --format='%H %s' 2>/dev/null; } > "$S/env.txt" 2>&1
  $PY -m gateway.tidegate_cli serve --port "$PORT" --model "$MODEL" --load-format "$LOAD_FORMAT" \
      --device "$DEVICE" --log-level warning --step-log "$S/steps.jsonl" > "$S/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    grep -q "serving model" "$S/serve.log" 2>/dev/null && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  grep "serving model" "$S/serve.log" || { tail -30 "$S/serve.log"; exit 1; }
  rc=0
  # 1, 2: the oracle edit workload (baseline with speculation off first, same invocation)
  if [ "$EDIT" = 1 ]; then
  bench --workload edit --oracle --keep 1,0.75,0.5 --num-requests "$NREQ" --output-len "$OUTLEN" \
      --max-concurrency 1 --json "$S/edit_c1.json" --trace-dir "$S/trace_c1" || rc=1
  late "edit c=8" || bench --workload edit --oracle --keep 1 --num-requests $((2 * NREQ)) \
      --output-len "$OUTLEN" --max-concurrency 8 --json "$S/edit_c8.json" || rc=1
  fi
  # 3: saturation, all at once: the server's policy vs per-request off, alternated; each run
  # its own prompts (--seed), so that no run finds the one before it in the session store
  k=0
  for w in $SAT; do
    io=${w%x*}; n=${w#*x}; in=${io%/*}; out=${io#*/}
    for mode in ${SAT_MODES:-auto off auto off}; do
      late "saturation $w $mode" && continue
      bench --input-len "$in" --output-len "$out" --num-requests "$n" --seed $((k + 11)) \
          --speculation "$mode" --json "$S/sat_${in}_${out}_${mode}_$((++k)).json" \
          > "$S/sat_${in}_${out}_${mode}_$k.txt" 2>&1 || rc=1
    done
  done
  # 4: the sim-vs-live loads, 75% of lines kept, traces for part sim
  for c in $LOADS; do
    late "load c=$c" && continue
    bench --workload edit --oracle --keep 0.75 --num-requests $((NREQ > c ? NREQ : 2 * c)) \
        --output-len "$OUTLEN" --max-concurrency "$c" --seed 2 --json "$S/load_c$c.json" \
        --trace-dir "$S/trace_load_c$c" || rc=1
  done
  curl -s "$URL/metrics" > "$S/metrics.txt" 2>/dev/null
  kill $server; wait $server 2>/dev/null
  $PY - "$S" > "$OUT/spec_serve_table.txt" <<'PYEOF'
import glob, json, os, sys
S = sys.argv[1]
for f in sorted(glob.glob(f"{S}/edit_c*.json")) + sorted(glob.glob(f"{S}/load_c*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), "c =", d["concurrency"])
    for name, r in d["runs"].items():
        print(f"  {name:<10} TPOT p50 {r['tpot_ms']['p50']:8.2f} ms  ratio "
              f"{d['tpot_p50_ratio_vs_off'].get(name) or 1:.3f}  tok/s {r['output_throughput']:8.1f}"
              f"  accept {r['spec_decode'].get('acceptance_rate')}")
sat = {}
for f in sorted(glob.glob(f"{S}/sat_*.json")):
    _, i, o, mode, _ = os.path.basename(f)[:-5].split("_")
    sat.setdefault((i, o), {}).setdefault(mode, []).append(json.load(open(f))["output_throughput"])
for (i, o), modes in sat.items():
    best = {m: max(v) for m, v in modes.items()}
    ratio = best.get("auto", 0) / best["off"] if best.get("off") else None
    mean = {m: sum(v) / len(v) for m, v in modes.items()}
    mratio = mean.get("auto", 0) / mean["off"] if mean.get("off") else None
    print(f"saturation {i}/{o}: tok/s policy {modes.get('auto')} off {modes.get('off')} "
          f"ratio(best) {ratio} ratio(mean) {mratio}")
PYEOF
  cat "$OUT/spec_serve_table.txt"
  cp "$W/skipped.txt" "$S/" 2>/dev/null
  tar czf "$OUT/spec_serve.tar.gz" -C "$W" serve
  exit $rc
fi

if [ "$PART" = sim ]; then
  rm -rf "$W/sim"; mkdir -p "$W/sim"; M=$W/sim
  # part serve's results: still on this machine, else its tarball ($SERVE_TAR, $OUT, or
  # committed under bench/results/spec_h200/ so that it travels with the tree)
  if [ ! -d "$W/serve" ]; then
    for t in "${SERVE_TAR:-}" "$OUT/spec_serve.tar.gz" bench/results/spec_h200/spec_serve.tar.gz; do
      [ -n "$t" ] && [ -f "$t" ] && tar xzf "$t" -C "$W" && break
    done
  fi
  [ -d "$W/serve" ] || { echo "no results of PART=serve (set SERVE_TAR)" >&2; exit 1; }
  S=$W/serve
  # verify-shaped points: k + 1 = 9-token chunks at 1,024- and 3,072-token contexts (the edit
  # prompts of FILE_CHARS 3000 are ~3,100 tokens: a profile at 1,024 only left the simulator
  # extrapolating the context, 2026-12-03), 8 of them packed, beside 0-32 decodes (32: the c=32
  # load's drafting steps, ~25 decodes + 7 verifies at ~3,200 tokens, ran 3.7% over a model whose
  # cached-prefix and packed points stopped at 8 decodes, 2026-12-04); and the same chunks as
  # verifies of 8 drafts, timed through the runner's verify path (sampled at every position)
  timeout "${PROFILE_S:-420}" $PY -m gateway.tidegate_cli backend profile --model "$MODEL" --load-format dummy \
      --device "$DEVICE" --out "$M/profile.json" --decode-batch-sizes 0,1,8,32 \
      --prefill-tokens 0,9,72,512 --context-lens "${PROFILE_CONTEXTS:-1024,3072}" --packed-prefill-seqs 8 \
      --prefill-context-lens "${PROFILE_CONTEXTS:-1024,3072}" --packed-decode-batch-sizes 0,1,8,32 \
      --verify-drafts 8 --repeats 3 \
      > "$M/profile.log" 2>&1 || { tail -20 "$M/profile.log"; exit 1; }
  live=(); sim=()
  for c in $LOADS; do
    $PY -m sims.speculation --profile "$M/profile.json" --concurrency "$c" \
        --trace "$S/trace_load_c$c/keep=0.75.jsonl" --host-turn "${HOST_TURN:-measured}" \
        --json "$M/sim_c$c.json" || exit 1
    live+=("$S/load_c$c.json"); sim+=("$M/sim_c$c.json")
  done
  $PY -m bench.simulator.spec_validate --live "${live[@]}" --sim "${sim[@]}" \
      --json "$M/spec_validate.json" | tee "$OUT/spec_sim_table.txt"
  # beside it, the other host-turn model (sims.speculation.EngineTurns.HOST_TURNS), for the record
  alt=$([ "${HOST_TURN:-measured}" = measured ] && echo launch || echo measured); sim_alt=()
  for c in $LOADS; do
    $PY -m sims.speculation --profile "$M/profile.json" --concurrency "$c" \
        --trace "$S/trace_load_c$c/keep=0.75.jsonl" --host-turn "$alt" \
        --json "$M/sim_${alt}_c$c.json" > /dev/null && sim_alt+=("$M/sim_${alt}_c$c.json")
  done
  [ ${#sim_alt[@]} = ${#live[@]} ] && $PY -m bench.simulator.spec_validate --live "${live[@]}" \
      --sim "${sim_alt[@]}" --json "$M/spec_validate_$alt.json" > "$M/spec_sim_table_$alt.txt"
  tar czf "$OUT/spec_sim.tar.gz" -C "$W" sim
  exit 0
fi
echo "PART must be serve or sim" >&2; exit 2
