"""Issue 35, session 29: what the random-filled profile should change on the H100 FP8 part, before a profile
measures it. The part's profile read a zeroed pool; the replay of 700 of its live steps (`replay_live`, 3
pipelined passes) read decode-only steps over random pages 1.007 (d 2-3), 1.012 (d 4-15), 1.016 (d 16-31) of
the same steps over zeros, steps with prefill 0.999. This writes a copy of the profile with each decode-only
point's times scaled by that ratio at its d (d >= 32 as d 16-31: the window had too few), for
`validate_replay --profile`: a what-if of the fill, not a measurement of it.

    python fill_whatif.py 6.7b-fp8/profile_6.7b-fp8.json profile_fill_whatif.json
"""
import json
import sys
from pathlib import Path

import numpy as np

D = np.array([2.0, 4.0, 8.0, 16.0])
R = np.array([1.0071, 1.0115, 1.0117, 1.0155])  # filled / zeros, decode-only, by d bin's lower edge (the replay)

doc = json.loads(Path(sys.argv[1]).read_text())
n = 0
for p in doc["points"]:
    if p["num_prefill_tokens"] == 0 and p["num_decode_seqs"] > 0:
        f = float(np.interp(np.log2(p["num_decode_seqs"]), np.log2(D), R))
        for k in ("step_ms", "step_ms_min", "step_ms_median", "device_ms_median", "device_ms_min"):
            if k in p:
                p[k] *= f
        n += 1
doc["fill_whatif"] = {"scaled_points": n, "d": D.tolist(), "filled_over_zeros": R.tolist()}
Path(sys.argv[2]).write_text(json.dumps(doc) + "\n")
print(f"{n} decode-only points scaled -> {sys.argv[2]}")
