"""The rooms of `backend/` and which may import which (issue 26), as tests beside the package
rules of `test_import_rules.py`: each layer imports only the layers below it, so the runtime
reads bottom-up (docs/architecture.md, "backend/ by layer").

    floor 7  server/        the worker on the wire, its CLI, tensor-parallel rank processes
    floor 6  engine/        continuous batching around scheduler/, echo, vLLM's; the assembler
    floor 5  runner/        one device step: buffers, sampler, CUDA graphs
    floor 4  model/         the LLaMA model, loader, tokenizer files, weight quantization
    floor 3  kernels/       Triton, C (cpu/) and their torch references (reference/)
    floor 2  kv/ distributed/   KV formats, pools, sizing, host tier; collectives, sharding
    floor 1  config, errors the model's shape and the one-line errors
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_import_rules import import_graph

FLOORS = {
    "backend.config": 1, "backend.errors": 1,
    "backend.kv": 2, "backend.distributed": 2,
    "backend.kernels": 3,
    "backend.model": 4,
    "backend.runner": 5,
    "backend.engine": 6,
    "backend.server": 7,
}


def room(module: str) -> str | None:
    """The room (folder, or a foundation file) a backend module lives in."""
    for name in sorted(FLOORS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return None


def _backend_edges():
    edges, _ = import_graph()
    return {m: {d for d in deps if d.startswith("backend.")}
            for m, deps in edges.items() if m.startswith("backend.")}


def test_every_backend_module_lives_in_a_room():
    edges = _backend_edges()
    assert len(edges) > 40
    homeless = sorted(m for m in edges if room(m) is None and m != "backend")
    assert homeless == [], f"modules outside the rooms of FLOORS: {homeless}"


def test_no_backend_layer_imports_one_above_it_or_beside_it():
    bad = []
    for module, deps in _backend_edges().items():
        src = room(module)
        for dep in deps:
            dst = room(dep)
            if src is None or dst is None or dst == src:
                continue
            if FLOORS[dst] >= FLOORS[src]:
                bad.append(f"{module} (floor {FLOORS[src]}) imports {dep} (floor {FLOORS[dst]})")
    assert bad == [], "\n".join(sorted(bad))


@pytest.mark.parametrize("module,dep,allowed", [
    ("backend.server.worker", "backend.engine.interface", True),
    ("backend.kv.host_tier", "backend.kernels.block_gather", False),   # the tier gets it injected
    ("backend.kernels.rotary_kv", "backend.kv.formats", True),
    ("backend.kv.pools", "backend.distributed.group", False),          # same floor, other room
])
def test_the_rule_itself(module, dep, allowed):
    src, dst = FLOORS[room(module)], FLOORS[room(dep)]
    assert (room(module) == room(dep) or dst < src) is allowed


def test_the_worker_reaches_engines_only_through_the_interface():
    deps = _backend_edges()["backend.server.worker"]
    engine_deps = {d for d in deps if room(d) == "backend.engine"}
    # RequestOutput is the records' type; everything else goes through ServingEngine
    assert engine_deps <= {"backend.engine.interface", "backend.engine.continuous"}
    src = Path(__file__).resolve().parents[1].joinpath("backend/server/worker.py").read_text()
    for reach in ("engine.scheduler", "engine.states", "engine.runner", "getattr(self.engine",
                  "getattr(engine"):
        assert reach not in src, f"the worker reaches through the engine: {reach}"
