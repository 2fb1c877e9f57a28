"""The pool's failure handling: a dropped ZMQ connection or a silent backend marks it down, its
in-flight requests are aborted there and, if they have produced no token yet, sent once to
another backend; Hello retries bring a restarted backend back. A mixin of
`gateway.backend_pool.BackendPool` (it reads and changes the pool's state)."""
from __future__ import annotations

import asyncio
import logging
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from gateway.backend_conn import BackendConn, Dispatch
from gateway.errors import backend_error
from proto import codec

log = logging.getLogger("tidegate.gateway.pool")


class PoolFailover:
    async def _watch_connection(self, backend: BackendConn) -> None:
        """ZMQ socket events: a dropped connection (the backend process died) marks the backend
        down at once, without waiting for the heartbeat window; a new one gets a Hello."""
        mon = backend.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            while True:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    self._mark_down(backend, "connection lost")
                elif event == zmq.EVENT_CONNECTED and not backend.healthy:
                    self._hello(backend, time.monotonic())
        finally:
            backend.sock.disable_monitor()
            mon.close(linger=0)

    async def _monitor(self) -> None:
        timeout = self.config.heartbeat_timeout_s
        period = min(timeout / 4, self.config.hello_interval_s)
        woke = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - woke - period > timeout / 4:
                # Woken this late, this process was not running (a long handler, a loaded host):
                # no backend's message could be read meanwhile, so the silence is ours. Each
                # healthy backend gets half a window from now, and a ping, before it is judged
                # (a CI run marked its backend down after a 1 s stall and answered 503).
                for b in self.backends:
                    if b.healthy and now - b.last_seen > timeout / 2:
                        b.last_seen = now - timeout / 2
                        b.send(codec.make_health(next(self._nonce), time.time()))
            woke = now
            for b in self.backends:
                if b.healthy and now - b.last_seen > timeout:
                    waiting = b.sock is not None and b.sock.get(zmq.EVENTS) & zmq.POLLIN
                    b.io.check()  # reading EVENTS may have eaten the readable edge
                    if waiting:
                        continue  # messages are waiting: we are slow, not the backend
                    self._mark_down(b, f"no message for {now - b.last_seen:.1f} s")
                if not b.healthy and now - b.last_hello >= self.config.hello_interval_s:
                    self._hello(b, now)
                elif b.healthy and now - b.last_seen > timeout / 2:
                    b.send(codec.make_health(next(self._nonce), time.time()))

    def _mark_down(self, backend: BackendConn, reason: str) -> None:
        if backend.healthy:
            log.warning("backend %s down: %s", backend.address, reason)
        backend.healthy = False
        self._update_accepting(backend)
        self._evacuate(backend, reason)

    def _evacuate(self, backend: BackendConn, reason: str) -> None:
        """A backend went down with requests of ours. They are aborted there (a hung process
        that comes back frees their KV blocks; a dead one ignores it); one that has produced no
        token yet is sent once more to another healthy backend, one that streamed tokens fails:
        its text cannot be resumed elsewhere without repeating or skipping output."""
        ids = list(backend.inflight)
        if not ids:
            return
        self._send_abort(backend, ids)
        retry: list[Dispatch] = []
        for rid in ids:
            generated = backend.inflight[rid][1]
            self._owner.pop(rid, None)
            dispatch = self._forget(backend, rid)
            if dispatch is None:
                continue
            if generated == 0 and not dispatch.retried:
                retry.append(dispatch)
            else:
                dispatch.sink.on_error(backend_error(
                    f"Backend {backend.address} stopped answering ({reason}) after {generated} "
                    "tokens of this request were produced; it cannot be resumed.",
                    code="backend_down"))
        if retry:
            self._retry(retry, backend, reason)

    def _retry(self, items: list[Dispatch], failed: BackendConn, reason: str) -> None:
        cap = self.config.max_inflight_per_backend
        target = min((b for b in self.backends if b.healthy and b is not failed
                      and not b.draining and b.num_inflight + len(items) <= cap),
                     key=lambda b: (b.outstanding_tokens, b.num_inflight), default=None)
        sent = None
        if target is not None:
            for d in items:
                d.retried = True
                d.charged_left = len(d.prompt_ids) + d.sampling.max_tokens  # uncached there
                self.placement.charge(target.pid, d.charged_left)
            sent = self.send_batch(target, items)
        if sent is None:
            for d in items:
                d.sink.on_error(backend_error(
                    f"Backend {failed.address} stopped answering ({reason}) and no other "
                    "backend could take the request.", code="backend_down"))
            return
        self.num_retried += len(sent)
        self._on_retry(len(sent))
        log.info("re-dispatched %d requests from %s to %s", len(sent), failed.address,
                 target.address)
