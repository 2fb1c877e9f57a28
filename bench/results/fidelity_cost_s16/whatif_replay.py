"""Issue 35, session 16 (H35F): `bench.simulator.validate_replay` with the power cap weighted by step kind
switched on (`ProfileCost(cap_by_power=True)`, opt-in: sims.profile_cost "Power by step kind"). The
validate's tools have no flag for it yet; this wrapper sets the keyword on every ProfileCost the replay
builds and passes its arguments on unchanged. With a profile without the "sustained_mixed" run it
changes nothing (every prefill step weighs 1).

    python whatif_replay.py VALIDATE DECISIONS STEPS --profile P [validate_replay options]
"""
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator import validate_replay
from sims.profile_cost import ProfileCost

_from_json = ProfileCost.from_json.__func__


@functools.wraps(_from_json)
def _by_power(cls, path, **kwargs):
    kwargs.setdefault("cap_by_power", True)
    return _from_json(cls, path, **kwargs)


ProfileCost.from_json = classmethod(_by_power)

if __name__ == "__main__":
    sys.exit(validate_replay.main(sys.argv[1:]))
