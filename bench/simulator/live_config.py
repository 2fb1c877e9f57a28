"""The live backend's configuration as the simulator needs it, read from the flags it ran with.

Its own module so that `validate` (which runs the simulations) and the replay tools
(`fidelity_resim`, `fidelity_steps`, which `validate` calls back for its step tables) can both use
it without importing each other in a loop."""
from __future__ import annotations

import argparse


def live_prefill_cap(device: str, engine_args: list[str]):
    """The `PrefillCap` the live backend runs with: its engine flags on `device` (a CUDA backend
    caps prefill while decoding by default, the CPU does not; the simulator's own default is
    off, so it is handed the live one)."""
    from engine_flags import add_engine_args
    from scheduler.capacity import prefill_cap_from_args

    p = argparse.ArgumentParser(add_help=False)
    add_engine_args(p)
    ns, _ = p.parse_known_args(["--device", device, *engine_args])
    return prefill_cap_from_args(ns, ns.device)
