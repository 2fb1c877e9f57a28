"""Two parts' live decode-only steps by exact decode batch d: median step and device ms of each, and B / A
(session 38: the 6.7B bf16 on session 37's card, A, and on session 38's, B: B ran 2.7-5.2 % slower at every d).

    python bench/results/pairs_s38/cmp_decode_steps.py A/steps_*.jsonl.gz B/steps_*.jsonl.gz
"""
import gzip
import json
import statistics as st
import sys


def load(p):
    out = {}
    with gzip.open(p, 'rt') as f:
        for line in f:
            s = json.loads(line)
            if s.get('prefill_tokens', 0) == 0 and s['decodes'] > 0:
                out.setdefault(s['decodes'], []).append((s['ms'], s.get('device_ms') or float('nan')))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
print(" d   nA  nB   msA    msB   ratio  devA   devB  dratio")
for d in sorted(set(a) & set(b)):
    if len(a[d]) < 20 or len(b[d]) < 20: continue
    ma, mb = st.median(x[0] for x in a[d]), st.median(x[0] for x in b[d])
    da, db = st.median(x[1] for x in a[d]), st.median(x[1] for x in b[d])
    print(f"{d:3d} {len(a[d]):4d} {len(b[d]):4d} {ma:6.3f} {mb:6.3f} {mb/ma:6.3f} {da:6.3f} {db:6.3f} {db/da:6.3f}")
