"""Where a CTA of the FA2-class backward spends its time, from the per-CTA timeline that
`flashmask_harness --timeline` prints (a build with -DFLASHMASK_EXP_TIMELINE:
EXTRA_NVCC_FLAGS="-DFLASHMASK_EXP_TIMELINE" benchmarks/device/harness/build_variant.sh NAME).
Per case: prologue (entry to the first step), the loop's cost a step, epilogue, the gaps
between CTAs on an SM and the idle tail. Usage: timeline_summary.py timeline.txt[.gz]"""
import argparse
import collections
import gzip

import numpy as np

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("timeline", help="the harness output (tl, lines), plain or gzip")
args = ap.parse_args()
opener = gzip.open if args.timeline.endswith(".gz") else open
recs=collections.defaultdict(list)
for line in opener(args.timeline,'rt'):
    if not line.startswith('tl,'): continue
    f=line.strip().split(',')
    name=f[1]; v=list(map(int,f[2:]))
    recs[name].append(v)  # cta, sm, gt, c0, c1, c2, c3, steps, head, nblock
for name,rs in recs.items():
    a=np.array(rs,dtype=np.int64)
    cta,sm,gt,c0,c1,c2,c3,steps,head,nb=a.T
    # clock rate per SM: fit gt vs c0
    rates=[]
    for s in np.unique(sm):
        m=sm==s
        if m.sum()>3:
            p=np.polyfit(c0[m],gt[m],1); rates.append(p[0])
    ns_per_clk=np.median(rates); ghz=1/ns_per_clk
    us=lambda x: x*ns_per_clk/1000
    live=c1>0
    pro=us(c1[live]-c0[live]); loop=us(c2[live]-c1[live]); epi=us(c3[live]-c2[live]); st=steps[live]
    # gaps on same SM
    gaps=[]; idle_end=[]
    end_gt=gt+ (c3-c0)*ns_per_clk
    t_end=end_gt.max(); t_start=gt.min()
    busy=0
    for s in np.unique(sm):
        m=np.where(sm==s)[0]; o=m[np.argsort(c0[m])]
        for i in range(1,len(o)):
            gaps.append(us(c0[o[i]]-c3[o[i-1]]))
        busy+=us((c3[o]-c0[o]).sum())
        idle_end.append((t_end-end_gt[o[-1]])/1000)
    span=(t_end-t_start)/1000
    nsm=len(np.unique(sm))
    print(f'== {name}: {len(a)} CTAs ({live.sum()} live) on {nsm} SMs, {ghz:.2f} GHz, span {span:.0f} us, busy {busy/nsm/span:.3f} of SM time')
    print(f'   steps mean {st.mean():.1f}; per step {np.median(loop/np.maximum(st,1)):.2f} us (median), prologue median {np.median(pro):.1f} us (p90 {np.percentile(pro,90):.1f}), epilogue median {np.median(epi):.1f} us (p90 {np.percentile(epi,90):.1f})')
    print(f'   gap between CTAs on an SM: median {np.median(gaps):.2f} us, mean {np.mean(gaps):.2f}; idle at end per SM mean {np.mean(idle_end):.1f} us')
    # fit loop = a + b*steps
    p=np.polyfit(st, loop, 1); print(f'   loop fit: {p[1]:.1f} us + {p[0]:.2f} us/step')
    tot=pro.sum()+loop.sum()+epi.sum()+sum(gaps)
    print(f'   share: prologue {pro.sum()/tot:.3f} loop {loop.sum()/tot:.3f} epilogue {epi.sum()/tot:.3f} gaps {sum(gaps)/tot:.3f}')
