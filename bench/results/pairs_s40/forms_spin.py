"""Issue 35, session 40: the H100 parts of the grid state (and their pooled cells) replayed in the cap's forms with
the busy level (`--decode-spells spin`: sims.profile_cost, "The busy level"), beside the default and session 39's
best forms, without the ceiling draws (the intervals and means do not depend on them). The H200 parts have no
no-pause timing, so "spin" leaves them as they are (`--decode-spells spin` falls back to the spells there).

    python bench/results/pairs_s40/forms_spin.py [--jobs 2] [PART ...]   # ~15 min on 2 cores; writes forms/
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("forms_grid", HERE.parent / "pairs_s39" / "forms_grid.py")
fg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fg)

fg.HERE = HERE  # forms/ beside this script
fg.FORMS = {"default": [], "stream": ["--cap-anchors", "stream"],
            "stream_fast": ["--cap-anchors", "stream", "--cap-onset", "fast"],
            "spin": ["--decode-spells", "spin"], "stream_spin": ["--cap-anchors", "stream", "--decode-spells", "spin"]}
fg.POOLS = {k: v for k, v in fg.POOLS.items() if k.startswith("h100-")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not [a for a in argv if not a.startswith("-") and not a.isdigit()]:
        argv += [p for p in fg.sources() if p.startswith("h100-")]
    return fg.main(argv)


if __name__ == "__main__":
    sys.exit(main())
