#!/usr/bin/env bash
# Issue 36's training call needs its corpus carried (the H200 reaches no network and has other
# packages installed): this builds it in one command on the development machine, the steps
# scripts/gpu_tiny_coder_run.sh's header lists one by one. A checkout of a new session starts
# without the git-excluded carry, so start this first thing (in the background: ~25-35 min on
# a busy 2-core box, single-threaded and niced) and make the device call when it has finished:
#
#   bash scripts/prepare_tiny_coder_carry.sh            # CAP=7e6 -> .carry-tc-7mb (~21 MB)
#   run(carry=[".carry-tc-7mb"], timeout_s=600,
#       command="CARRY=.carry-tc-7mb bash scripts/gpu_tiny_coder_run.sh")
#
# CAP (bytes of training text per installed distribution, 7e6; the held-out, validation and
# standard-library files are never capped) names the carry: .carry-tc-<CAP in MB>mb. The last
# line printed is what travels (tree + carry), which must stay under 64 MiB (67.1 MB).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CAP=${CAP:-7e6}
MB=$($PY -c "print(int(float('$CAP') / 1e6))")
DEST=.carry-tc-${MB}mb
WORK=${WORK:-/tmp/tc-carry}
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
mkdir -p "$WORK"
t0=$(date +%s)
echo "[$(( $(date +%s) - t0 ))s] building the corpus from $($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
[ -s "$WORK/full/corpus.jsonl" ] || nice -n 10 $PY -m training.corpus --out "$WORK/full"
echo "[$(( $(date +%s) - t0 ))s] capping at $CAP bytes per source"
rm -rf "$WORK/capped"
$PY -m training.corpus --recap-from "$WORK/full" --out "$WORK/capped" --max-source-bytes "$CAP"
rm -rf "$DEST" && mkdir -p "$DEST/corpus"
cp "$WORK/capped/manifest.json" "$DEST/corpus/"
echo "[$(( $(date +%s) - t0 ))s] compressing (xz -9e, one thread)"
nice -n 10 xz -T1 -9e -c "$WORK/capped/corpus.jsonl" > "$DEST/corpus/corpus.jsonl.xz"
echo "[$(( $(date +%s) - t0 ))s] $DEST: $(du -b "$DEST/corpus/corpus.jsonl.xz" | cut -f1) bytes"
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null \
    | tail -1 | cut -f1)
carry=$(du -sb "$DEST" | cut -f1)
echo "travels: tree $tree + carry $carry = $(( tree + carry )) bytes (limit 67108864)"
