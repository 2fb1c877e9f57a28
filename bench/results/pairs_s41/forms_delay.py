"""Issue 35, session 41: the H100 grid (every part of `fidelity_grid_state` on an H100, and the pooled cells) in the
default form, `stream_fast` (the nearest form by burst place, section 5) and the delayed onset (`--cap-onset delay`,
sims.profile_cost "The delayed onset"; parts whose profile lacks it replay as the default). Replays without the ceiling
draws, deleted after counting.

    python bench/results/pairs_s41/forms_delay.py [--jobs 2]   # ~15 min on 2 cores; writes forms_delay/forms/counts.md|json
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("forms_spin_s41", HERE / "forms_spin.py")
s41 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s41)
fg = s41.fg

fg.FORMS = {"default": [], "stream_fast": ["--cap-anchors", "stream", "--cap-onset", "fast"],
            "delay": ["--cap-onset", "delay"]}


def main(argv: list[str] | None = None) -> int:
    (HERE / "forms_delay").mkdir(exist_ok=True)
    fg.HERE = HERE / "forms_delay"  # its counts in forms_delay/forms/, apart from forms_spin.py's
    return s41.s40.main(argv)


if __name__ == "__main__":
    sys.exit(main())
