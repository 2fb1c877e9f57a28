#!/usr/bin/env bash
# The device machine copies the working tree, at most 64 MiB with the carried paths (.whl/ and
# the like). bench/results/ holds ~30 MB of raw records that no device script reads, so for the
# length of a device call:
#
#   bash scripts/device_slim.sh size   # what would travel (tracked + untracked-not-ignored)
#   bash scripts/device_slim.sh out    # bench/results' TRACKED files leave the work tree
#   ... the device call ...
#   bash scripts/device_slim.sh in     # back (git checkout); untracked files there never move
#
# Between out and in the removed files carry git's skip-worktree bit, so a `git commit -a` made
# meanwhile does not record their deletions (session 23 made one without it: 6,191 files).
set -eu
cd "$(git rev-parse --show-toplevel)"
KEEP='/profile[^/]*\.json$|/tuned_[^/]*\.json$|/compositions_[^/]*\.json$|\.py$|\.sh$'  # files under bench/results that device calls read or run (replay_live's compositions, the analysis and check scripts: session 33 lost a call to a slimmed .sh)
size() {
  (git ls-files -z; git ls-files -z --others --exclude-standard; [ -d .whl ] && find .whl -type f -print0) \
    | du -cb --files0-from=- 2>/dev/null | tail -1 | awk '{printf "%.1f MB with .whl/ (limit 67.1 MB: 64 MiB)\n", $1/1e6}'
}
case "${1:-}" in
  size) size ;;
  out) # kept: what device scripts read (gpu_slo_run.sh's 33B profile, the host-cost tuner's configs)
       git ls-files -z bench/results | grep -z -v -E "$KEEP" | xargs -0 git update-index --skip-worktree
       git ls-files -z bench/results | grep -z -v -E "$KEEP" | xargs -0 rm -f
       echo "bench/results: tracked files removed from the work tree but $KEEP; after the call: bash $0 in"
       size ;;
  in) git ls-files -z bench/results | xargs -0 git update-index --no-skip-worktree
      git checkout -- bench/results && echo "bench/results restored" ;;
  *) echo "usage: $0 size|out|in" >&2; exit 2 ;;
esac
