"""Issue 35, session 17 (H35Q): `bench.simulator.validate_replay` with every ProfileCost built with
`decode_extrapolation=MODE` ("nearest": the model before session 17, for the before tables; "slope":
today's default). Arguments after MODE pass on unchanged.

    python replay_mode.py MODE VALIDATE DECISIONS STEPS --profile P [validate_replay options]
"""
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator import validate_replay
from sims.profile_cost import ProfileCost

_from_json = ProfileCost.from_json.__func__
MODE = sys.argv[1]


@functools.wraps(_from_json)
def _with_mode(cls, path, **kwargs):
    kwargs.setdefault("decode_extrapolation", MODE)
    return _from_json(cls, path, **kwargs)


ProfileCost.from_json = classmethod(_with_mode)

if __name__ == "__main__":
    sys.exit(validate_replay.main(sys.argv[2:]))
