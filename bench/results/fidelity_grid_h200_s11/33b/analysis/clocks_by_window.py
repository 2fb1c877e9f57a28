"""Issue 35 (grid 33B): nvidia-smi SM clock and power by the steps in the 100 ms before each sample."""
import sys

import numpy as np

from bench.simulator.fidelity_steps import live_steps, read_steps
from bench.simulator.h200_clocks import read_smi
from scheduler.decisions import read_log

R=sys.argv[1]
ts,rows_s=read_smi(R+'/smi_33b.csv.gz'); ts=np.array(ts)
rows=read_steps(R+'/steps_33b.jsonl.gz')
arr,b=read_log(R+'/decisions_33b.jsonl.gz')
steps,_=live_steps(rows,{a.request_id:a.max_tokens for a in arr})
# wall offset: t - mono
off=np.median([r['t']-r['mono'] for r in rows])
print('smi clock offset vs step log wall: check; rows',len(rows_s))
st=np.array([s['start'] for s in steps])+off; en=np.array([s['end'] for s in steps])+off
P=np.array([s['p'] for s in steps]); D=np.array([s['d'] for s in steps])
out={}
for t,r in zip(ts,rows_s):
    # window 100ms before sample
    m=(en>t-0.1)&(st<t)
    if not m.any(): continue
    span=np.minimum(en[m],t)-np.maximum(st[m],t-0.1)
    if span.sum()<0.09: continue
    f=span[P[m]>0].sum()/0.1
    big=(P[m]>256).any()
    key=('idle-ish' if span.sum()<0.09 else ('f<0.01' if f<0.01 else 'f0.01-0.5' if f<0.5 else 'f0.5-0.9' if f<0.9 else 'f>=0.9'))+(' (>256-token prefill)' if big else '')
    out.setdefault(key,[]).append((r['clocks.sm'],r['power.draw']))
for k,v in sorted(out.items()):
    v=np.array(v,dtype=float); print(f"{k:35s} n={len(v):4d} SM MHz median {np.median(v[:,0]):.0f}  power W median {np.median(v[:,1]):.0f}")
