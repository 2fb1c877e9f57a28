"""Issue 35 (grid 33B): live plan lead before the previous step's read-back, from the step log's host_ms."""
import gzip
import json
import sys

import numpy as np

with gzip.open(sys.argv[1], 'rt') as fh:
    rows = [json.loads(line) for line in fh]
lead={}
for k in range(1,len(rows)):
    r,p=rows[k],rows[k-1]
    if 'host_ms' not in r: continue
    end=r['mono']+r['ms']/1e3
    plan=end-sum(r['host_ms'])/1e3
    pend=p['mono']+p['ms']/1e3
    if r['mono']-pend>5e-4: continue  # idle before
    kind=('P' if p['prefill_tokens'] else 'D')+'->'+('P' if r['prefill_tokens'] else 'D')
    lead.setdefault(kind,[]).append(1e3*(pend-plan))
for k,v in sorted(lead.items()):
    v=np.array(v); print(k,len(v),'lead ms pcts 5/25/50/75/95:',np.round(np.percentile(v,[5,25,50,75,95]),2),'mean',v.mean().round(2))
# host phases
hp=np.array([r['host_ms'] for r in rows if 'host_ms' in r])
print('host phases median',np.median(hp,axis=0))
print('missing host_ms',sum('host_ms' not in r for r in rows))
