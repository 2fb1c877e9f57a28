"""Issue 35, session 31: the live decode-only steps' excess over the profile (decode_exact.py's table) by where d
sits in its decode-graph bucket: µs over the raw model at each d, the bucket, and the padded rows (bucket - d).

    python bench/results/fidelity_h100_s31/bucket_excess.py PART_DIR/read/decode_exact.txt PART_DIR/profile_*.json
"""
import bisect
import json
import re
import sys
from pathlib import Path

rows = []
for line in Path(sys.argv[1]).read_text().splitlines():
    m = re.match(r"d\s+(\d+) n\s+(\d+) live/model ([\d.]+) ctx (\d+) live ms ([\d.]+)", line)
    if m:
        rows.append((int(m[1]), int(m[2]), float(m[3]), float(m[5])))
buckets = sorted(json.loads(Path(sys.argv[2]).read_text())["cuda_graph_decode_buckets"])
print(f"{'d':>4} {'bucket':>6} {'pad':>4} {'n':>5} {'live/model':>10} {'excess us':>9}")
for d, n, r, ms in rows:
    b = buckets[bisect.bisect_left(buckets, d)]
    print(f"{d:4d} {b:6d} {b - d:4d} {n:5d} {r:10.4f} {1000 * (ms - ms / r):9.0f}")
