"""Regenerate ``proto/tidegate_pb2.py`` (+ ``.pyi``) from ``proto/tidegate.proto``.

    python -m proto.generate           # rewrite the checked-in modules (also: make proto)
    python -m proto.generate --check   # exit 1 with a diff summary if they are stale

Uses ``protoc`` from ``grpcio-tools``. The output depends on its version, so the
check compares against what *this* environment generates.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILE = PROTO_DIR / "tidegate.proto"
GENERATED = ("tidegate_pb2.py", "tidegate_pb2.pyi")


def generate(out_dir: Path) -> None:
    """Run protoc on ``tidegate.proto``, writing the generated modules into ``out_dir``."""
    from grpc_tools import protoc  # dev dependency; imported only here

    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_FILE}")


def stale_files(checked_in_dir: Path = PROTO_DIR) -> dict[str, list[str]]:
    """Generate into a temp dir; return {file name: diff lines} for each file that differs."""
    stale: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for name in GENERATED:
            fresh = (Path(tmp) / name).read_text()
            path = checked_in_dir / name
            current = path.read_text() if path.exists() else ""
            if fresh != current:
                stale[name] = list(
                    difflib.unified_diff(
                        current.splitlines(), fresh.splitlines(),
                        f"checked-in/{name}", f"fresh/{name}", lineterm="", n=1,
                    )
                )
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the checked-in modules differ from a fresh generation")
    args = parser.parse_args(argv)
    if not args.check:
        generate(PROTO_DIR)
        print(f"generated {', '.join(GENERATED)} in {PROTO_DIR}")
        return 0
    stale = stale_files()
    if not stale:
        print("proto: generated modules are up to date")
        return 0
    for name, diff in stale.items():
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        print(f"proto: {name} is stale ({changed} changed lines); run `python -m proto.generate`")
        print("\n".join(diff[:40]))
        if len(diff) > 40:
            print(f"... ({len(diff) - 40} more diff lines)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
