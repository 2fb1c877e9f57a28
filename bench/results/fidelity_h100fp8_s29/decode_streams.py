"""Issue 35, session 29: are the live decode-only steps' ~1.5-3 % over the profile a busy stream's cost?

On the H100 6.7B (bf16 and FP8, session 21) and the H200 6.7B (session 16), live decode-only steps of near-equal
contexts run 1.5-3 % over the profile's paused device time at d = 5-7, 9-14, 17-29, 33-38 and 45-59, but ~1.00 at
d = 1-4, 8, 16 and 32, also at d the profile measured itself (18, 24, 25, 26, 33, 34, 48-50): `decode_exact.py`.
Here each decode shape alone in its own stream, as session 28's `stream_kinds.py` runs a step kind: paused device
times (the profile's way), then after IDLE_S idle SPAN_S of it back to back, two in flight, in 1 s bins. If the
excess is the stream's, the ratios read ~1.00 at d 8 / 16 / 32 and 1.015-1.03 at d 24 / 33 / 48; flat ~1.00 at
every d says it is not (the live steps' changing batches or contexts are the next suspects).

    python bench/results/fidelity_h100fp8_s29/decode_streams.py --model deepseek-coder-6.7b --device cuda --out d.json
    python bench/results/fidelity_h100fp8_s29/decode_streams.py --model tiny --device cpu --out /tmp/d.json --span-s 0.3
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity_sag_s28"))
import stream_kinds

DS = (8, 16, 17, 24, 32, 33, 48)
# (d, p, c, k, s): d decodes of context 576 (the grid's mean context per sequence), no prefill
stream_kinds.KINDS.clear()
stream_kinds.KINDS.update({f"decode_{d}": [(d, 0, 576, 1, 0)] for d in DS})

if __name__ == "__main__":
    stream_kinds.main()
