"""Issue 35, session 41: the pause check's "sustained" trace (its 512-token prefill step back to back from idle) in
device time over the same step's paused device time (the "stream_kind" prefill run's: same shape, same pause), by
time since the trace began. Why: the live busy steps with prefill read a burst's first four places at the paused
level and its later ones 1.5-2.5 % over (`burst_place.txt`); if the card's limiter acts after a dead time, its own
trace shows it.     python bench/results/pairs_s41/trace_onset.py PROFILE.json [...]"""
import json
import statistics
import sys

WINDOWS_MS = ((0, 40), (40, 80), (80, 120), (120, 250), (250, 1000), (1000, 10_000))

for path in sys.argv[1:]:
    with open(path) as f:
        doc = json.load(f)
    runs = doc["pause_check"]["runs"]
    tr = next(r for r in runs if r.get("run") == "sustained")
    pre = next((r for r in runs if r.get("run") == "stream_kind" and r.get("kind") == "prefill"), {})
    base = pre.get("paused_device_ms_median")
    if not base or not tr.get("trace_device_ms"):
        print(f"{path}: no device trace or paused device time")
        continue
    t, dev = tr["trace_t_ms"], tr["trace_device_ms"]
    cells = []
    for lo, hi in WINDOWS_MS:
        xs = [d for ti, d in zip(t, dev) if lo <= ti < hi]
        cells.append(f"{lo}-{hi if hi < 10_000 else ''} ms: {statistics.median(xs) / base:.4f} ({len(xs)})" if xs else "")
    print(f"{doc.get('model', '?')} {doc.get('device_name', '')}: paused device {base:.3f} ms; " + "; ".join(c for c in cells if c))
