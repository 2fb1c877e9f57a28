"""Issue 35 (grid 33B): model/live by step kind with no power cap, by prefill share only, by compute share."""
import sys

import numpy as np

from bench.simulator.fidelity_steps import busy_shares, live_steps, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost, _features

R=sys.argv[1]
arr,b=read_log(R+'/decisions_33b.jsonl.gz'); rows=read_steps(R+'/steps_33b.jsonl.gz')
steps,_=live_steps(rows,{a.request_id:a.max_tokens for a in arr})
c=ProfileCost.from_json(R+'/profile_33b.json',hide_launch=True,power_cap=True)
f_ref,r,r_dec=c._cap
base=float(_features(0,0,0,0,0,0,c._cols,0,0)@c.coef)
sref=1-base/c.step_time(0,512,512)
res={}
for k,s in enumerate(steps):
    if s['idle_before'] or not(s['p'] or s['d']): continue
    ctx=s['ctx']+sum(n+st for n,st in s['chunks'])
    t=c.step_time(s['d'],s['p'],ctx,s['chunks'] or None)
    f,g=busy_shares(steps,k,0.1)
    x=(r-1)*max(0,f-f_ref)/(1-f_ref)+(r_dec-1)*g
    sh=1-base/t
    tu=t*(1+x*sh/sref)
    # prefill share only: what the prefill tokens add to the step without them, over the
    # pause check step's (1 - T_const / T(0, 512)); decode-only steps unslowed
    td = c.step_time(s['d'], 0, s['ctx']) if s['d'] else base
    tc = t * (1 + x * (1 - td / t) / sref) if s['p'] else t
    kind=('P' if s['p'] else 'D'+('p' if s['prefill_before'] else ''))+(' f>=0.7' if f>=0.7 else ' f<0.7')
    res.setdefault(kind,[]).append((s['ms'],1e3*t,1e3*tc,1e3*tu))
for k in sorted(res):
    a=np.array(res[k]); print(f"{k:12s} n={len(a):5d} nocap {a[:,1].sum()/a[:,0].sum():.4f} prefill-share-only {a[:,2].sum()/a[:,0].sum():.4f} compute-share {a[:,3].sum()/a[:,0].sum():.4f}")
print('sref uniform',sref)
