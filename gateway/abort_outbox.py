"""Aborts that must reach their backend even when its socket is full.

An Abort the DEALER cannot queue (high-water mark: the backend is slow to read, or its
connection is gone and libzmq's queue filled) must not be dropped: the request would run on
there to `max_tokens`, holding its KV blocks. `AbortOutbox.send` keeps such ids per backend and
sends them again, all of a backend's in one Abort, every `ABORT_RETRY_S` until queued. Aborts
are idempotent and order-free at the backend (unknown ids are ignored), so a late one is
harmless.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proto import codec

log = logging.getLogger("tidegate.gateway.pool")
ABORT_RETRY_S = 0.05


class AbortOutbox:
    def __init__(self, is_member: Callable[[object], bool]) -> None:
        self._is_member = is_member  # a backend that left the pool has its socket closed
        self._waiting: dict[object, dict[str, None]] = {}  # backend -> request ids (ordered set)
        self._timer: asyncio.TimerHandle | None = None
        self.num_retries = 0  # Abort messages that had to be sent again

    @property
    def num_waiting(self) -> int:
        """Request ids whose Abort waits for room in their backend's socket."""
        return sum(map(len, self._waiting.values()))

    def send(self, backend, ids: list[str]) -> None:
        """Abort `ids` on `backend` (anything with `send(envelope) -> bool`), now or later."""
        if backend.send(codec.make_abort(ids)):
            return
        waiting = self._waiting.setdefault(backend, {})
        if not waiting:
            log.warning("backend %s: socket full, %d aborts wait to be sent", backend.address,
                        len(ids))
        waiting.update(dict.fromkeys(ids))
        self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        if self._timer is None and self._waiting:
            self._timer = asyncio.get_running_loop().call_later(ABORT_RETRY_S, self._retry)

    def _retry(self) -> None:
        self._timer = None
        for backend, waiting in list(self._waiting.items()):
            if not self._is_member(backend):
                log.warning("backend %s left with %d aborts unsent", backend.address,
                            len(waiting))
                del self._waiting[backend]
                continue
            self.num_retries += 1
            if backend.send(codec.make_abort(list(waiting))):
                del self._waiting[backend]
        self._schedule()
