"""Issue 35, session 41: session 40's count of the cap's forms (`../pairs_s40/forms_spin.py`: default, stream,
stream_fast, spin, stream_spin) over every H100 part of the grid state, now with session 41's two parts and the
cells pooled since session 40 (runs over several calls: the 6.7B bf16's 13, the 33B bf16's 6; seeds: the 33B FP8's
8, the int4-fp8 KV's 7). Replays without the ceiling draws; the replays (~18 MB) are deleted after counting.

    python bench/results/pairs_s41/forms_spin.py [--jobs 2]   # ~20 min on 2 cores; writes forms/counts.md|json
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("forms_spin_s40", HERE.parent / "pairs_s40" / "forms_spin.py")
s40 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s40)
fg = s40.fg

fg.HERE = HERE  # forms/ beside this script
fg.POOLS = {**fg.POOLS,
            "h100-6.7b-13runs": ("h100-6.7b-s34", "h100-6.7b-s35", "h100-6.7b-s38", "h100-6.7b-s40"),
            "h100-33b-6runs": ("h100-33b-s39", "h100-33b-s39-2", "h100-33b-s40"),
            "h100-33b-fp8-8seeds": ("h100-33b-fp8-s38", "h100-33b-fp8-s41"),
            "h100-33b-kvint4-7seeds": ("h100-33b-kvint4-s38", "h100-33b-kvint4-s38-2", "h100-33b-kvint4-s41")}

if __name__ == "__main__":
    sys.exit(s40.main())
