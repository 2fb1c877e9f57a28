#!/usr/bin/env bash
# (s16's collect.sh, this directory's OUTROOT.) Copy live.sh's outputs ($OUTROOT/live_*) here, the logs gzipped (s15's set of files per run and
# the lag trace; the backends' and gateways' logs left out).
OUTROOT=${OUTROOT:-/tmp/h31d/s17}
HERE=$(cd "$(dirname "$0")" && pwd)
for d in "$OUTROOT"/live_*/; do
  n=$(basename "$d"); mkdir -p "$HERE/$n/trace"
  for f in slo_control.json decision_fidelity.json plan.txt rate.txt metrics_a.txt load.txt; do
    [ -f "$d/$f" ] && cp "$d/$f" "$HERE/$n/"
  done
  for f in decisions_a.jsonl records_a.jsonl; do gzip -9c "$d/$f" > "$HERE/$n/$f.gz"; done
  cat "$d"/backend_*.log 2>/dev/null | grep "deadline order:" > "$HERE/$n/promotions.txt"
  for f in "$d"/trace/*.jsonl; do gzip -9c "$f" > "$HERE/$n/trace/$(basename "$f").gz"; done
done
