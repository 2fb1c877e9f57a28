"""Issue 31, eighth session: a bench-only trace of where a request's dispatch -> first token goes,
on CLOCK_MONOTONIC in every process (the gateway's decision log and the client share it). Off
unless TIDEGATE_LAG_TRACE=DIR is set; put this directory first on PYTHONPATH and every Python
process the run starts imports it (site's sitecustomize hook). It patches, after their modules
load and without changing what they do:

- gateway.dispatcher.Dispatcher._send_window: the window's start and end ("win": t0, t1, ids);
- gateway.backend_pool.BackendPool.send_batch: each Batch on the wire ("send": t before, pid,
  ids, t after);
- gateway.dispatcher.Dispatcher.on_first_token: ("first": rid, now the message was read, t the
  handler ran);
- backend.server.worker.Worker._add: a request's receipt on the backend ("recv": t, rid);
- backend.engine.echo.EchoEngine.step: the step's start and end and the requests it started
  ("step": t0, t1, started ids, running, waiting);
- backend.server.worker.Worker._flush_pending: when the step's outputs went out ("out": t before,
  outputs, t after).

Records stay in memory and are written as JSON lines to DIR/<role>_<pid>.jsonl every 2,000 and at
exit (a few microseconds a record).
"""
import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_DIR = os.environ.get("TIDEGATE_LAG_TRACE")
_rows: list = []
_role = ["proc"]


def _dump() -> None:
    if not _rows:
        return
    with open(os.path.join(_DIR, f"{_role[0]}_{os.getpid()}.jsonl"), "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in _rows)
    _rows.clear()


def _rec(row) -> None:
    _rows.append(row)
    if len(_rows) >= 2000:
        _dump()


def _rid(key: str) -> str:
    return key.split("/", 1)[1] if "/" in key else key


def _patch_dispatcher(mod) -> None:
    D = mod.Dispatcher
    send_window, first = D._send_window, D.on_first_token

    def _send_window(self, batch):
        if self.decision_log is None:  # gateway B (no admission log): not traced
            return send_window(self, batch)
        _role[0] = "gw"
        t0 = time.monotonic()
        try:
            return send_window(self, batch)
        finally:
            _rec(["win", t0, time.monotonic(), [r.request_id for r in batch]])

    def on_first_token(self, handle, now):
        if self.decision_log is not None:
            _rec(["first", handle.request_id, now, time.monotonic()])
        return first(self, handle, now)

    D._send_window, D.on_first_token = _send_window, on_first_token


def _patch_pool(mod) -> None:
    P = mod.BackendPool
    send_batch = P.send_batch

    def _send(self, backend, items):
        t0 = time.monotonic()
        out = send_batch(self, backend, items)
        if _role[0] == "gw":
            _rec(["send", t0, getattr(backend, "pid", -1), [d.request_id for d in items],
                  time.monotonic()])
        return out

    P.send_batch = _send


def _patch_worker(mod) -> None:
    W = mod.Worker
    add, flush = W._add, W._flush_pending
    _role[0] = "be"

    def _add(self, identity, req, prompt, prediction=None):
        _rec(["recv", time.monotonic(), req.request_id])
        return add(self, identity, req, prompt, prediction)

    def _flush_pending(self):
        n = sum(len(v) for v in self.pending.values())
        t0 = time.monotonic()
        flush(self)
        if n:
            _rec(["out", t0, n, time.monotonic()])

    W._add, W._flush_pending = _add, _flush_pending


def _patch_echo(mod) -> None:
    E = mod.EchoEngine
    step = E.step

    def _step(self):
        t0 = time.monotonic()
        outs = step(self)
        started = [_rid(o.request_id) for o in outs if o.num_completion_tokens == 1]
        _rec(["step", t0, time.monotonic(), started, len(self.scheduler.running),
              len(self.scheduler.waiting)])
        return outs

    E.step = _step


_PATCHES = {"gateway.dispatcher": _patch_dispatcher, "gateway.backend_pool": _patch_pool,
            "backend.server.worker": _patch_worker, "backend.engine.echo": _patch_echo}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, _PATCHES[name]
        exec_module = loader.exec_module

        def _exec(module):
            exec_module(module)
            patch(module)

        loader.exec_module = _exec
        return spec


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)
