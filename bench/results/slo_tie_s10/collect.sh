#!/usr/bin/env bash
# Issue 31, tenth session: copy the live runs' raw files here: /tmp/i31live/fid_* -> hash_*
# (slo_read_s9/fid_trace.sh with EXTRA_WINDOW="--placement-tie-break hash", TREE = a `git
# archive` of 928baa1, the lag trace on), with lag_parts.json from slo_lag_s8/lag_parts.py (its
# step end -> gateway read feeds the "read" replay). Gateway traces kept, all gzipped.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$HERE/../../..
for src in /tmp/i31live/fid_*; do
  name=hash_$(basename "$src" | sed 's/^fid_//')
  dst=$HERE/$name; rm -rf "$dst"; mkdir -p "$dst/trace"
  [ -f "$src/lag_parts.json" ] || (cd "$ROOT" && .venv/bin/python bench/results/slo_lag_s8/lag_parts.py "$src" \
      --json "$src/lag_parts.json" > "$src/lag_parts.txt" 2>&1) || true
  for f in load.txt rate.txt plan.txt metrics_a.txt slo_control.json decision_fidelity.json lag_parts.json lag_parts.txt; do
    [ -f "$src/$f" ] && cp "$src/$f" "$dst/"
  done
  gzip -c "$src/decisions_a.jsonl" > "$dst/decisions_a.jsonl.gz"
  gzip -c "$src/records_a.jsonl" > "$dst/records_a.jsonl.gz"
  for t in "$src"/trace/gw_*.jsonl; do gzip -c "$t" > "$dst/trace/$(basename "$t").gz"; done
done
