"""SIGTERM/SIGINT for a gateway process: owned from start-up to exit, never their default action.

A supervisor (systemd, Kubernetes, a test) may send SIGTERM more than once; ^C in a terminal
sends SIGINT to the whole process group. The first one starts the drain; none may turn the
drain's exit 0 into a kill (-15) or a KeyboardInterrupt.

Why a Python-level handler (`signal.signal`) rather than the event loop's `add_signal_handler`:
the loop's `remove_signal_handler` (called by us, or by the loop's close for every handler still
registered) sets SIG_DFL (SIGINT: `default_int_handler`), so whatever comes after it -- even
`signal.signal(sig, SIG_IGN)` on the very next line -- leaves a window in which a late signal
kills the process. It is microseconds wide, but a supervisor signalling in a loop hits it (a
SIGTERM storm killed 1 of 30 to 19 of 40 gateways on session 18's shared 2-core machine, as its
load went; a SIGINT storm ended 18 of 40 with KeyboardInterrupt). A handler installed with
`signal.signal` and never registered with the loop is never reset by the loop; at the end it is
replaced by SIG_IGN in one `sigaction` call (`ignore()`), so the disposition goes handler ->
SIG_IGN with no SIG_DFL in between, and interpreter finalization leaves SIG_IGN alone (it resets
only Python-level handlers to SIG_DFL: ending on our handler would reopen the window there).

Why not block the signals and `sigwait` in a thread: every thread (the default executor's, ZMQ's,
an embedded backend's helpers) would have to be started after the block, and a child started
with `subprocess` inherits the blocked mask (the embedded backend would not see its SIGTERM).
Blocking them in the main thread alone does not help while their action is SIG_DFL: the kernel
hands a process-directed signal to any thread that does not block it, and SIG_DFL kills the
whole process whichever thread takes it.

Waking the loop: CPython runs a Python-level handler in the main thread at its next bytecode
boundary, whichever thread the kernel delivered the signal to. If that was another thread while
the main thread sleeps in epoll, only the wakeup fd (`signal.set_wakeup_fd`) wakes it. uvloop sets
one whenever it runs in the main thread and runs pending Python handlers when it reads it
(`Loop._read_from_self`); plain asyncio sets one only in `add_signal_handler`, so `attach` sets
its own when no loop has (the asyncio fallback, where uvloop is missing). The handler itself
only records the signal and schedules `stop.set` with `call_soon_threadsafe` (it may run between
any two bytecodes of the loop's own code, so it must not touch the loop's state directly, and it
must never raise). After that it returns at once: CPython runs a handler again at the next
bytecode boundary inside the handler itself if another signal came, so a storm of signals
recursed through a handler that did more (a RecursionError out of the --workers parent's).
Returning at once shortens each level but does not bound the nesting: the call's own start is
such a boundary, so a sustained storm can still nest it level after level. The --workers parent,
signalled through all its workers' drains, nested up to 92 deep and now and then to the limit; it
no longer has a handler (gateway.workers). A gateway process is exposed from its first signal to
`ignore()`: its storms passed at recursion limit 60 (session 19: 40 of 40 SIGTERM and 20 of 20
SIGINT hammer runs, 5 of 5 through a 0.8 s drain), where the old parent failed 4 of 30.
"""
from __future__ import annotations

import asyncio
import signal
import socket
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """`install()` once in the main thread, before anything else starts; `attach(loop, event)`
    while the loop runs (the event is set by the first signal, or at once if one came before);
    `detach()` before the loop closes; `ignore()` last, once nothing is left to stop."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first SIGTERM/SIGINT seen, if any
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None  # ours, if we set one
        self._forwarded = False  # stop.set is scheduled: later signals have nothing to do

    def install(self) -> StopSignals:
        # Without SA_RESTART (CPython's default; not `siginterrupt(sig, False)`, as the loops'
        # add_signal_handler does): a main thread blocked in a call the kernel would restart
        # (waitpid, a blocking read) must come back to Python to run the handler.
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self._forwarded:
            return
        loop, event = self._loop, self._event
        if loop is None or event is None:
            return  # not serving yet (attach() looks at `received`) or any more
        self._forwarded = True  # first: a signal landing in the call below returns above
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop closed under us: nothing left to stop
            pass

    def attach(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self._loop, self._event = loop, event
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        old = signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        if old != -1:  # the loop has its own (uvloop in the main thread): keep it
            signal.set_wakeup_fd(old, warn_on_full_buffer=False)
            rsock.close()
            wsock.close()
        else:
            self._wakeup = (rsock, wsock)
            loop.add_reader(rsock.fileno(), self._drain_wakeup)
        self._forwarded = self.received is not None
        if self._forwarded:
            event.set()

    def _drain_wakeup(self) -> None:
        # reading is enough: returning to Python code runs the pending handler (_on_signal)
        if self._wakeup is None:
            return
        try:
            while self._wakeup[0].recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def detach(self) -> None:
        loop, self._loop, self._event = self._loop, None, None
        if self._wakeup is not None:
            rsock, wsock = self._wakeup
            self._wakeup = None
            current = signal.set_wakeup_fd(-1)
            if current not in (wsock.fileno(), -1):  # not ours (any more): put it back
                signal.set_wakeup_fd(current, warn_on_full_buffer=False)
            if loop is not None and not loop.is_closed():
                loop.remove_reader(rsock.fileno())
            rsock.close()
            wsock.close()

    @staticmethod
    def ignore() -> None:
        """Our handler -> SIG_IGN in one call each: never SIG_DFL in between."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
