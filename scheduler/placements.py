"""Every placement policy by its `--placement` name, and the one constructor.

Apart from `scheduler.placement` (the config, the items and the policies built on its base
classes) because `scheduler.ttft_placement` builds on those classes: a constructor there that
named TTFTPlacement was an import loop."""
from __future__ import annotations

from scheduler.placement import (
    LeastTokensPlacement,
    PlacementConfig,
    PrefixAffinityPlacement,
    WindowPlacement,
)
from scheduler.ttft_placement import TTFTPlacement

CLASSES: dict[str, type[LeastTokensPlacement]] = {
    "least-tokens": LeastTokensPlacement, "prefix": PrefixAffinityPlacement,
    "window": WindowPlacement, "ttft": TTFTPlacement}


def create_placement(config: PlacementConfig) -> LeastTokensPlacement:
    return CLASSES[config.policy](config)
