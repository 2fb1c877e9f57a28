"""ZMQ sockets on the event loop without zmq.asyncio's per-message futures.

zmq.asyncio turns every `recv_multipart` into a Future plus reader (re)registration and every
send into a send-event round, with enum flag arithmetic on each: about a quarter of the gateway's
CPU per 1-token request. Here a socket is read by one `loop.add_reader` callback that drains it
with NOBLOCK receives, and sends are plain NOBLOCK sends on the same socket (the sugar layer, no
future). The socket is still created from a `zmq.asyncio.Context`, so monitor sockets and
anything else that wants to await it keeps working; only never `await sock.recv*()` on a socket
read here (zmq.asyncio would take over the file descriptor).

The ZMQ file descriptor is edge-triggered: any operation on the socket, a send or a
`get(EVENTS)` included, may consume the "readable" signal. So every send is followed by an
EVENTS check that schedules a drain when messages are waiting.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

log = logging.getLogger("tidegate.gateway.zmqio")

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE) | _NOBLOCK
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
MAX_PER_DRAIN = 256  # messages per reader callback before yielding to the loop
# The Cython socket's own send/recv/get: the sugar layer's wrappers add flag enums and checks
# that cost more than the libzmq call (~3x for a two-frame send + receive).
_BASE = zmq.Socket.__mro__[1]
_send, _recv, _get = _BASE.send, _BASE.recv, _BASE.get




class SocketReader:
    """Calls `on_message(frames)` (zmq.Frame list, copy=False) for every message on `sock`."""

    def __init__(self, sock: zmq.Socket, on_message: Callable[[list], None]) -> None:
        # A plain (non-asyncio) Socket object over the same libzmq socket: its recv/send are
        # direct calls, no Future machinery.
        self.sock = zmq.Socket.shadow(sock.underlying)
        self._on_message = on_message
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._scheduled = False
        self.last_errno = 0  # errno of the last failed send (EAGAIN: full; EHOSTUNREACH: gone)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = self.sock.get(zmq.FD)
        self._loop.add_reader(self._fd, self._drain)
        self._schedule()  # messages may already be queued (their edge came before us)

    def stop(self) -> None:
        if self._loop is not None and self._fd is not None:
            try:
                self._loop.remove_reader(self._fd)
            except (RuntimeError, ValueError, OSError):  # loop closed / fd gone
                pass
        self._fd = None

    def send(self, frames: list) -> bool:
        """Send without blocking; False when it would block or the socket is closed."""
        sock = self.sock
        last = len(frames) - 1
        try:
            for i, frame in enumerate(frames):
                _send(sock, frame, _SNDMORE if i < last else _NOBLOCK)
        except zmq.ZMQError as exc:
            self.last_errno = exc.errno
            return False
        finally:
            self.check()
        return True

    def check(self) -> None:
        """Call after anything that touched the socket: drain soon if messages are waiting."""
        if self._fd is None or self._scheduled:
            return
        try:
            readable = _get(self.sock, _EVENTS) & _POLLIN
        except zmq.ZMQError:
            return
        if readable:
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        if self._fd is None:
            self._scheduled = False
            return
        # While draining, sends from the handlers need no EVENTS check: we read until EAGAIN.
        self._scheduled = True
        sock, on_message = self.sock, self._on_message
        try:
            for _ in range(MAX_PER_DRAIN):
                try:
                    if not _get(sock, _EVENTS) & _POLLIN:  # cheaper than raising zmq.Again
                        return
                    frame = _recv(sock, _NOBLOCK, False)
                    frames = [frame]
                    while frame.more:  # the rest of a multipart message is already here
                        frame = _recv(sock, _NOBLOCK, False)
                        frames.append(frame)
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:  # closed under us
                    log.debug("reader stops: %s", exc)
                    return
                try:
                    on_message(frames)
                except Exception:  # a bug in a handler must not stop the reader
                    log.exception("error handling a ZMQ message")
        finally:
            self._scheduled = False
        self._schedule()  # more may be waiting: give the loop a turn first
