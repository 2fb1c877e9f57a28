"""Run `tidegate serve` many times under a signal storm; print the exit codes as JSON.

    python tests/signal_hammer.py --runs 40 --signal SIGTERM -- --backend ipc://...

Each run is a real gateway process: `gateway.serve.main(ARGV)` in a child forked from this
process, which has imported the gateway's modules once (a fresh interpreter per run spends most
of its time importing: forking from a warm one makes 40 runs cost what ~6 would), and which ends
as the command does, through the interpreter's own exit (finalization included, where a handler
left installed would be reset to SIG_DFL). Once the child prints its "serving model" line, this
process sends it the signal as fast as it can -- the first starts the drain, the rest land
during and after it -- until the child exits. The exit code is 0 when every signal after the
first was a no-op; -15 (SIGTERM's default action) or a KeyboardInterrupt's exit is the defect
tests/test_gateway_signals.py guards against. The window it looks for is microseconds wide,
hence the storm and the many runs. Used by tests/test_gateway_signals.py; `--no-uvloop` runs
the plain-asyncio fallback.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(serve_main, argv: list[str], sig: int, ready_timeout_s: float,
            storm_timeout_s: float, recursion_limit: int | None = None) -> dict:
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the gateway: its stdout to the pipe, then the command's own exit
        os.setpgid(0, 0)  # its own process group: whatever it leaves behind is found below
        os.close(r)
        os.dup2(w, 1)
        os.close(w)
        if recursion_limit is not None:
            sys.setrecursionlimit(recursion_limit)
        raise SystemExit(serve_main(argv))  # nothing in this file catches it: a normal exit
    os.close(w)
    out = b""
    deadline = time.monotonic() + ready_timeout_s
    while b"serving model" not in out and time.monotonic() < deadline:
        if select.select([r], [], [], 0.1)[0]:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            out += chunk
    sent = 0
    t0 = time.monotonic()
    if b"serving model" in out:
        # waitid(WNOWAIT) leaves the child unreaped: its pid cannot be reused while we signal it
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() - t0 > storm_timeout_s:
                os.kill(pid, signal.SIGKILL)
                break
            os.kill(pid, sig)
            sent += 1
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    stop_s = time.monotonic() - t0
    try:  # a process of its group still there (a --workers worker, an embedded backend): left
        os.killpg(pid, signal.SIGKILL)  # behind by the gateway (its children exit before it)
        left_behind = True
    except ProcessLookupError:
        left_behind = False
    os.close(r)  # only now: a closed pipe would fail the child's last flush of stdout
    return {"code": os.waitstatus_to_exitcode(status), "ready": b"serving model" in out,
            "left_behind": left_behind, "signals": sent, "stop_s": round(stop_s, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new run past this many seconds")
    p.add_argument("--signal", default="SIGTERM", choices=("SIGTERM", "SIGINT"))
    p.add_argument("--no-uvloop", action="store_true", help="the plain-asyncio fallback")
    p.add_argument("--ready-timeout", type=float, default=30.0)
    p.add_argument("--storm-timeout", type=float, default=30.0,
                   help="a gateway still up this long into the storm is killed (code -9)")
    p.add_argument("--recursion-limit", type=int, default=None,
                   help="the gateway's (sys.setrecursionlimit): a handler that re-enters itself "
                        "under the storm then fails within a few runs, not one in hundreds")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- then `tidegate serve`'s flags")
    args = p.parse_args()
    if args.no_uvloop:
        sys.modules["uvloop"] = None  # `import uvloop` raises ImportError: asyncio.run
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    from aiohttp import web  # noqa: F401 -- warm: what serve() imports

    import gateway.app
    import gateway.serve

    if threading.active_count() != 1:
        raise SystemExit("signal_hammer: a thread started at import: forking would be unsafe")
    argv = ["--port", "0", "--log-level", "warning",
            *[a for a in args.argv if a != "--"]]
    sig = getattr(signal, args.signal)
    start = time.monotonic()
    runs = []
    for _ in range(args.runs):
        if args.budget_s is not None and runs and time.monotonic() - start > args.budget_s:
            break
        runs.append(one_run(gateway.serve.main, argv, sig, args.ready_timeout,
                            args.storm_timeout, args.recursion_limit))
    print(json.dumps({"runs": runs, "codes": [r["code"] for r in runs],
                      "left_behind": sum(r["left_behind"] for r in runs),
                      "elapsed_s": round(time.monotonic() - start, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
