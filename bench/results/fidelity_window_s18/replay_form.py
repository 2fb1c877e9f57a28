"""Issue 35, session 18 (H35W): `bench.simulator.validate_replay` with the power cap's window form A
(window.py): the "sustained" trace's settled ratio r unchanged, its exponential average's time constant
replaced by TAU (fitted by window.py through the model's factor to the whole trace, its first step
left out). Analysis only: the library is unchanged; this patches `sims.profile_cost.fit_sustained_trace`
in this process so that its tau_s is TAU (r comes from its steady_ms, f_ref and the event loop's
shares from tau). Not for `--cap-by-power` (the mixed / packed runs' fits would take TAU too).

    python replay_form.py --tau-s 0.078 -- VALIDATE DECISIONS STEPS --profile P --json out.json
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import sims.profile_cost as pc


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] != "--tau-s" or "--" not in argv or "--cap-by-power" in argv:
        sys.exit(__doc__)
    tau = float(argv[1])
    rest = argv[argv.index("--") + 1:]
    orig = pc.fit_sustained_trace

    def fit(*a, **k):
        out = orig(*a, **k)
        if out is not None:
            out = {**out, "tau_s": tau, "tau_s_fit": out["tau_s"]}
        return out
    pc.fit_sustained_trace = fit
    print(f"replay_form: the sustained fit's tau_s replaced by {tau}", file=sys.stderr)
    sys.argv = ["validate_replay", *rest]
    runpy.run_module("bench.simulator.validate_replay", run_name="__main__")


if __name__ == "__main__":
    main()
