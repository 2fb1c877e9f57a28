"""The whole `tidegate` command: a thin dispatcher to each package's own `main(argv)`.

Subcommands import their package lazily (by module name), so that `tidegate sim` and
`tidegate serve` never load torch unless a backend runs in-process. It lives in gateway/
because the gateway is the torch-free package every install has; naming the other packages
only as strings keeps it from importing backend/ (the design's rule).
"""
from __future__ import annotations

import importlib
import sys

# name -> (module with a `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.serve", "run the OpenAI-compatible HTTP gateway (and, by default, an embedded backend)"),
    "backend": ("backend.server.cli", "run a model backend process over ZeroMQ (also: backend profile)"),
    "sim": ("sims.cli", "discrete-event simulation: run, sweep, fit, search, plan, validate"),
    "bench": ("bench.cli", "load generator against a live service (also: bench engine on a GPU)"),
    "keys": ("proto.keys_cli", "CURVE key pairs for the ZeroMQ sockets: keys generate DIR"),
    "eval": ("evals.cli", "model quality through our engine: perplexity, agreement"),
}

# (command, first argument) -> module, for subcommands that live outside their command's package:
# the live-vs-simulator comparison imports the gateway and the simulator, so it is bench's, while
# users find it under `tidegate sim`; the step-time profile is a measurement (bench's), while
# users find it under `tidegate backend`.
ROUTES: dict[tuple[str, str], str] = {("sim", "validate"): "bench.simulator.validate",
                                      ("backend", "profile"): "bench.engine.profile"}


def _usage() -> str:
    lines = ["usage: tidegate <command> [options]", "", "commands:"]
    for name, (_, doc) in SUBCOMMANDS.items():
        lines.append(f"  {name:<9} {doc}")
    lines.append("")
    lines.append("Run `tidegate <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"tidegate: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _ = SUBCOMMANDS[name]
    if rest and (name, rest[0]) in ROUTES:
        module_name, rest = ROUTES[name, rest[0]], rest[1:]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(module_name.split(".")[0]):
            print(f"tidegate {name}: not built yet ({module_name} is missing)", file=sys.stderr)
            return 3
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
