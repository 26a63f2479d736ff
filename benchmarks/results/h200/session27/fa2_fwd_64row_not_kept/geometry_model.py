import numpy as np, sys
def geom(lts, S, BM, BN):
    j = np.arange(S)
    live_cols = np.clip(lts - j, 0, None)  # rows j..lts-1 live
    live = live_cols.sum()
    comp = 0
    for kb in range(0, S, BN):
        lo = kb; hi = lts[kb:kb+BN].max()  # first live row min j = kb ; last row max lts
        # rows [kb, hi) touched, in q-blocks
        qb0 = lo // BM; qb1 = (hi + BM - 1) // BM
        # skip q-blocks wholly masked: rows where no column live
        cnt=0
        for qb in range(qb0, qb1):
            r0, r1 = qb*BM, min(S,(qb+1)*BM)
            c = np.arange(kb, min(S,kb+BN))
            # any live: exists col with r in [c, lts[c])
            if np.any((np.minimum(lts[c], r1) > np.maximum(c, r0))): cnt+=1
        comp += cnt*BM*BN
    return live/comp
for name in sys.argv[1:]:
    S = int(name.split('_')[-1].split('.')[0])
    lts = np.fromfile(f'.gpu_masks/{name}', dtype=np.int32)
    if lts.size != S: print(name, lts.size); continue
    out=[name]
    for BM,BN in [(128,64),(64,64),(128,32),(64,128),(128,128),(64,32)]:
        out.append(f"{BM}x{BN}:{geom(lts,S,BM,BN):.3f}")
    causal = np.full(S, S, np.int32)
    out.append(f"causal128x64:{geom(causal,S,128,64):.3f}")
    print(' '.join(out))
