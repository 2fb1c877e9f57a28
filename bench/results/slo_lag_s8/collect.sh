#!/usr/bin/env bash
# Issue 31, eighth session: copy the runs' raw files here (from /tmp/b31s8 = the plain echo
# backends, /tmp/b31s8p = paced). Traces kept for one run of each (fid_w15a, paced_w15a), gzipped.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
for src in /tmp/b31s8/fid_* /tmp/b31s8p/fid_*; do
  name=$(basename "$src"); case $src in /tmp/b31s8p/*) name=paced_${name#fid_};; esac
  dst=$HERE/$name; rm -rf "$dst"; mkdir -p "$dst"
  for f in load.txt rate.txt plan.txt metrics_a.txt slo_control.json decision_fidelity.json lag_parts.json lag_parts.txt; do
    [ -f "$src/$f" ] && cp "$src/$f" "$dst/"
  done
  gzip -c "$src/decisions_a.jsonl" > "$dst/decisions_a.jsonl.gz"
  gzip -c "$src/records_a.jsonl" > "$dst/records_a.jsonl.gz"
  if [ "$name" = fid_w15a ] || [ "$name" = paced_w15a ]; then
    mkdir -p "$dst/trace"; for t in "$src"/trace/*.jsonl; do gzip -c "$t" > "$dst/trace/$(basename "$t").gz"; done
  fi
done
