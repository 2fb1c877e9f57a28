#!/usr/bin/env bash
# Issue 31, ninth session: copy the live runs' raw files here: /tmp/b31s9 -> paced_* (fid_trace.sh
# of slo_lag_s8 with TREE = a `git archive` of 8d53ec8: the paced echo backends, the lag trace
# on); /tmp/b31s9cw -> cw_* (this directory's fid_trace.sh, EXTRA_WINDOW=--compete-window, TREE =
# the working tree of this session's commit).
# Every run keeps its gateway trace (gw_*: each Batch's backend, what the forced replay with the
# live placement follows); the w15a runs keep the backends' traces too. All gzipped.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
for src in /tmp/b31s9/fid_* /tmp/b31s9cw/fid_*; do
  case $src in /tmp/b31s9cw/*) pre=cw_;; *) pre=paced_;; esac
  name=$pre$(basename "$src" | sed 's/^fid_//')
  dst=$HERE/$name; rm -rf "$dst"; mkdir -p "$dst/trace"
  for f in load.txt rate.txt plan.txt metrics_a.txt slo_control.json decision_fidelity.json lag_parts.json lag_parts.txt; do
    [ -f "$src/$f" ] && cp "$src/$f" "$dst/"
  done
  gzip -c "$src/decisions_a.jsonl" > "$dst/decisions_a.jsonl.gz"
  gzip -c "$src/records_a.jsonl" > "$dst/records_a.jsonl.gz"
  for t in "$src"/trace/gw_*.jsonl; do gzip -c "$t" > "$dst/trace/$(basename "$t").gz"; done
  case $name in *w15a) for t in "$src"/trace/be_*.jsonl; do gzip -c "$t" > "$dst/trace/$(basename "$t").gz"; done;; esac
done
