"""`tidegate keys generate DIR [--name NAME]`: a CURVE key pair for tidegate's ZeroMQ sockets.

Writes DIR/NAME.key (public: hand it to peers, or put it in a server's --curve-allow
directory) and DIR/NAME.key_secret (secret, mode 0600: give its path to --curve-key).
Prints the two paths, never the keys.
"""
from __future__ import annotations

import argparse
import sys

from proto.security import generate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tidegate keys", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write a new key pair")
    g.add_argument("directory", help="where to write the key files (created if missing)")
    g.add_argument("--name", default="tidegate", help="file name stem (default: tidegate)")
    args = p.parse_args(argv)
    public, secret = generate(args.directory, args.name)
    print(f"public key: {public}\nsecret key: {secret} (mode 0600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
