#!/usr/bin/env bash
# Issue 28, the serving loop's stalls on the H200 (one device call, ~6-8 min: limits 240 + 180 s for the runs): the backend runs
# under bench.engine.loop_phases (every worker / engine phase and every GC collection timed, on
# the step log's clock) behind `tidegate serve --backend`, then
#   1. the c=32 oracle edit run of the stall report (keep 0.75, 64 x 256 tokens): the drafting
#      steps after a wave of ~3,100-token prompts; before the prompt-lookup fix (297a769) the
#      loop's host time there grew 1.6 us per new prompt token (80k tokens -> 144 ms);
#      expected now: engine._drafts <= ~5 ms, no gap over ~10 ms before a drafting step
#   2. saturation 512/128 x 400 at once: the idle gaps of 20-150 ms with 256 decodes and no
#      drafts (rows 73, 139, 620, 760 of the old log, ~17 steps apart): which phase holds them
#      (suspects: a GC collection, a burst of admissions in _drain, _flush_pending/_maybe_report)
# Writes under $OUT: steps.jsonl, phases.json, report.txt (loop_phases --report for each run),
# the bench JSONs, logs.
#   bash scripts/gpu_loop_stall_run.sh
#   MODEL=tiny DEVICE=cpu LOAD_FORMAT=dummy NREQ=16 OUTLEN=24 FILE_CHARS=600 SAT=64/8x32 \
#       bash scripts/gpu_loop_stall_run.sh       # the CPU check
set -u
OUT=${OUT:-out/gpu_loop_stall}
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
LOAD_FORMAT=${LOAD_FORMAT:-dummy-cycle}
NREQ=${NREQ:-64}
OUTLEN=${OUTLEN:-256}
FILE_CHARS=${FILE_CHARS:-3000}
SAT=${SAT-512/128x400}
PORT=${PORT:-18090}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
if ! $PY -c 'import zmq' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p "$OUT"
W=$(mktemp -d /tmp/loop_stall.XXXX)
SOCK=ipc://$W/backend.sock
URL="http://127.0.0.1:$PORT"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  git log -1 --format='%H %s' 2>/dev/null; } > "$OUT/env.txt" 2>&1
$PY -m bench.engine.loop_phases --out "$OUT/phases.json" -- --listen "$SOCK" --model "$MODEL" \
    --load-format "$LOAD_FORMAT" --device "$DEVICE" --cpu-affinity auto \
    --step-log "$OUT/steps.jsonl" > "$OUT/backend.log" 2>&1 &
backend=$!
for _ in $(seq 600); do
  grep -q "backend ready" "$OUT/backend.log" 2>/dev/null && break
  kill -0 $backend 2>/dev/null || break
  sleep 1
done
grep "backend ready" "$OUT/backend.log" || { tail -30 "$OUT/backend.log"; exit 1; }
$PY -m gateway.tidegate_cli serve --port "$PORT" --backend "$SOCK" --log-level warning \
    > "$OUT/serve.log" 2>&1 &
server=$!
for _ in $(seq 120); do grep -q "serving model" "$OUT/serve.log" 2>/dev/null && break; sleep 1; done
rc=0
name=$(basename "$MODEL")
date +%s.%N > "$OUT/t_edit_start"
timeout 240 $PY -m gateway.tidegate_cli bench serve --url "$URL" --model "$name" \
    --file-chars "$FILE_CHARS" --workload edit --oracle --keep 0.75 --max-concurrency 32 \
    --num-requests "$NREQ" --output-len "$OUTLEN" --seed 2 --json "$OUT/load_c32.json" \
    > "$OUT/bench_c32.txt" 2>&1 || rc=1
date +%s.%N > "$OUT/t_sat_start"
for w in $SAT; do
  io=${w%x*}; n=${w#*x}
  timeout 180 $PY -m gateway.tidegate_cli bench serve --url "$URL" --model "$name" \
      --input-len "${io%/*}" --output-len "${io#*/}" --num-requests "$n" --seed 11 \
      --json "$OUT/sat_${io%/*}_${io#*/}.json" > "$OUT/bench_sat.txt" 2>&1 || rc=1
done
kill $server; wait $server 2>/dev/null
kill $backend; wait $backend 2>/dev/null
# the report, per run (rows cut at the runs' start times, on the step log's wall clock `t`)
$PY - "$OUT" <<'PYEOF' > "$OUT/report.txt" 2>&1
import json, subprocess, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/steps.jsonl")]
t_sat = float(open(f"{out}/t_sat_start").read())
for name, part in (("edit c=32", [r for r in rows if r["t"] < t_sat]),
                   ("saturation", [r for r in rows if r["t"] >= t_sat])):
    if len(part) < 2:
        continue
    path = f"{out}/steps_{name.split()[0]}.jsonl"
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in part)
    print(f"==== {name}: {len(part)} steps")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "bench.engine.loop_phases", "--report", path,
                    "--out", f"{out}/phases.json"])
PYEOF
cat "$OUT/report.txt"
tail -n 5 "$OUT/bench_c32.txt" "$OUT/bench_sat.txt"
rm -rf "$W"
exit $rc
