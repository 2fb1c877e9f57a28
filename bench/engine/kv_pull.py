"""A long prefix made usable on a second backend: pulled from the backend that holds it (issue 34)
vs recomputed there. Two running backends (`tidegate backend`), driven over their ZMQ sockets:

    python -m bench.engine.kv_pull --holder ipc:///tmp/a.sock --receiver ipc:///tmp/b.sock \\
        --prefix-tokens 16384 --repeats 3 --json out/kv_pull.json

Per repeat, with fresh random prompts (so neither backend has them cached):
  recompute  the receiver prefills prompt X itself: TTFT of a max_tokens=1 request
  pull       the holder prefills prompt Y (untimed), then the receiver gets Y with kv_source =
             the holder: TTFT covers the pull (KvPull / KvBlocks over the wire) and the one token
  local      Y again on the receiver: its own prefix cache, the floor
speedup = recompute / pull. The receiver's LoadReport gives the measured pull rate and counts.
The pull goes to the holder's KV socket (`BackendInfo.kv_endpoint`, served off its step loop)
when it has one, else to its main socket (`--via main` forces that).

    python -m bench.engine.kv_pull --counters EP [EP ...]   # the backends' own pull counters

prints each backend's prefix-pull counters from a fresh LoadReport as JSON (what the live and
GPU scripts record after a run).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import zmq

from proto import codec
from proto import tidegate_pb2 as pb


class Backend:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.sock.send_multipart(codec.encode(codec.make_hello("bench-kv-pull", pb.Hello.GATEWAY)))
        self.info = None
        self.report = None
        while self.info is None:
            self._recv(600)

    def _recv(self, timeout_s: float):
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no message from {self.endpoint}")
        m = codec.decode(self.sock.recv_multipart())
        if m.kind == "backend_info":
            self.info = m.envelope.backend_info
        elif m.kind == "load_report":
            self.report = m.envelope.load_report
        return m

    def ttft(self, rid: str, prompt: list[int], source: str | None = None,
             timeout_s: float = 60.0) -> tuple[float, int]:
        """Seconds to the request's first token, and its cached prompt tokens."""
        env = pb.Envelope(batch=pb.Batch(batch_id=1))
        r = env.batch.requests.add(request_id=rid, prompt_frame=0)
        r.sampling.max_tokens, r.sampling.ignore_eos = 1, True
        if source is not None:
            r.kv_source.endpoint, r.kv_source.num_tokens = source, len(prompt) - 1
            r.kv_source.timeout_s = timeout_s
        t0 = time.perf_counter()
        self.sock.send_multipart(codec.encode(env, [prompt]))
        while True:
            m = self._recv(timeout_s + 600)
            if m.kind == "error" and m.envelope.error.request_id == rid:
                raise RuntimeError(f"{rid}: {m.envelope.error.message}")
            if m.kind != "step_output":
                continue
            for o in m.envelope.step_output.outputs:
                if o.request_id == rid and o.finish_reason:
                    return time.perf_counter() - t0, o.num_cached_tokens

    def fresh_report(self) -> pb.LoadReport:
        self.report = None
        deadline = time.monotonic() + 5
        while self.report is None and time.monotonic() < deadline:
            try:
                self._recv(1.5)
            except TimeoutError:
                pass
        return self.report


COUNTERS = ("num_prompt_tokens", "num_cached_prompt_tokens", "num_kv_pulls",
            "num_kv_pull_failures", "num_kv_pulled_tokens", "num_kv_pulls_served",
            "num_kv_pulls_ipc", "kv_pull_bytes_per_s", "prefill_tokens_per_s")


def counters(endpoints: list[str]) -> list[dict]:
    """Each backend's prefix-pull counters (a fresh LoadReport); None for one that sent none."""
    out = []
    for ep in endpoints:
        r = Backend(ep).fresh_report()
        out.append(None if r is None else {k: getattr(r, k) for k in COUNTERS})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine.kv_pull",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--holder", help="ZMQ endpoint of the backend holding it")
    ap.add_argument("--receiver")
    ap.add_argument("--via", choices=("kv", "main"), default="kv",
                    help="the holder's socket the pull goes to (kv: its KV socket if it has one)")
    ap.add_argument("--counters", nargs="+", metavar="EP",
                    help="print these backends' pull counters as JSON and exit")
    ap.add_argument("--prefix-tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--timeout", type=float, default=60.0, help="the pull's deadline, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    if a.counters:
        print(json.dumps(counters(a.counters), indent=1))
        return 0
    if not (a.holder and a.receiver):
        ap.error("--holder and --receiver are required (or --counters)")
    rng = random.Random(a.seed)
    holder, receiver = Backend(a.holder), Backend(a.receiver)
    source = holder.info.kv_endpoint if a.via == "kv" and holder.info.kv_endpoint else a.holder

    def prompt() -> list[int]:
        return [rng.randrange(3, a.vocab) for _ in range(a.prefix_tokens + 1)]

    receiver.ttft("warm", prompt()[:512])  # first-call costs out of the timings
    holder.ttft("warm", prompt()[:512])
    rows = []
    for k in range(a.repeats):
        x, y = prompt(), prompt()
        t_re, c_re = receiver.ttft(f"re{k}", x)
        holder.ttft(f"hold{k}", y)
        t_pull, c_pull = receiver.ttft(f"pull{k}", y, source=source, timeout_s=a.timeout)
        t_local, c_local = receiver.ttft(f"local{k}", y)
        rows.append({"recompute_s": t_re, "pull_s": t_pull, "local_s": t_local,
                     "cached_recompute": c_re, "cached_pull": c_pull, "cached_local": c_local})
        print(f"repeat {k}: recompute {t_re * 1e3:.0f} ms, pull {t_pull * 1e3:.0f} ms "
              f"({c_pull} tokens pulled), local hit {t_local * 1e3:.0f} ms: "
              f"x{t_re / t_pull:.2f}", flush=True)
    rep = receiver.fresh_report()
    med = {k: statistics.median(r[k] for r in rows) for k in ("recompute_s", "pull_s", "local_s")}
    out = {"prefix_tokens": a.prefix_tokens, "kv_cache_dtype": receiver.info.kv_cache_dtype,
           "pull_source": source, "off_loop": source != a.holder,
           "kv_layout": receiver.info.kv_layout, "kv_block_bytes": receiver.info.kv_block_bytes,
           "block_size": receiver.info.block_size, "rows": rows, "median": med,
           "speedup": med["recompute_s"] / med["pull_s"],
           "pull_bytes": (a.prefix_tokens // receiver.info.block_size) * receiver.info.kv_block_bytes,
           "receiver_report": {
               "num_kv_pulls": rep.num_kv_pulls if rep else None,
               "num_kv_pull_failures": rep.num_kv_pull_failures if rep else None,
               "num_kv_pulls_ipc": rep.num_kv_pulls_ipc if rep else None,
               "kv_pull_bytes_per_s": rep.kv_pull_bytes_per_s if rep else None,
               "prefill_tokens_per_s": rep.prefill_tokens_per_s if rep else None},
           "copy_bytes_per_s": receiver.info.kv_copy_bytes_per_s}
    print(f"median: recompute {med['recompute_s'] * 1e3:.0f} ms, pull {med['pull_s'] * 1e3:.0f} ms, "
          f"local {med['local_s'] * 1e3:.0f} ms; pull is x{out['speedup']:.2f} faster; "
          f"{out['pull_bytes'] / 1e6:.1f} MB moved")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
