"""The pool's receiving side: what each backend sends (BackendInfo, LoadReport, StepOutput, Error,
Health) handled on the event loop — introductions, load and prefix facts for placement, the token
fan-out to each request with its gap check, and errors. A mixin of `gateway.backend_pool.BackendPool`
(it reads and changes the pool's state: backends, placement, in-flight requests)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.backend_conn import BackendConn, Dispatch, error_from_backend
from gateway.errors import APIError, backend_error
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_FROM_WIRE

log = logging.getLogger("tidegate.gateway.pool")


class PoolReceiver:
    def _reader_for(self, backend: BackendConn) -> Callable[[list], None]:
        """The message handler of `backend`'s socket reader (called from the event loop)."""
        decode, handle = codec.decode, self._handle

        def on_message(frames: list) -> None:
            try:
                handle(backend, decode(frames))
            except codec.DecodeError as exc:
                self.num_dropped += 1
                self._on_dropped("backend")
                log.warning("dropped a malformed message from %s: %s", backend.address, exc)
                # Its outputs (a finish among them, maybe) are lost: the requests it names fail
                # now instead of waiting for their timeout.
                for rid in codec.peek_request_ids(frames):
                    if rid in backend.inflight:
                        self._fail_one(backend, rid, backend_error(
                            f"The backend sent a malformed message for this request: {exc}",
                            code="bad_backend_output"))
            except Exception:  # a bug here must not stop the reader
                self.num_dropped += 1
                log.exception("error handling a message from %s", backend.address)
        return on_message

    def _handle(self, backend: BackendConn, decoded: codec.Decoded) -> None:
        now = time.monotonic()
        env, kind = decoded.envelope, decoded.kind
        if kind == "backend_info":
            codec.check_version(env.backend_info.protocol_version)
            if not backend.healthy:
                log.info("backend %s up: model %s", backend.address, env.backend_info.model)
            backend.info = env.backend_info
            if self.pulls is not None:
                self.pulls.on_info(backend.pid, env.backend_info)
            self._on_info(backend.pid, env.backend_info)
            self._info = None  # recomputed on the next read
            self._mark_up(backend, now)
            self._ready.set()
        elif backend.info is None:
            if kind != "error":
                return  # not introduced yet (e.g. reports from before our Hello)
        elif backend.healthy:
            backend.last_seen = now
        else:
            # Marked down: only a BackendInfo (its answer to our Hello) brings it back. Messages
            # still buffered from a process that died, or from a hung one, would otherwise mark
            # a dead backend up with a stale load (its requests were already failed or moved).
            return
        if kind == "step_output":
            self._on_step(backend, decoded, now)
        elif kind == "load_report":
            report = backend.load = env.load_report
            if self.pulls is not None:
                self.pulls.on_report(backend.pid, report)
            if report.prefix_block_size:  # the backend keeps a prefix cache: facts
                self.placement.report(backend.pid, report.prefix_hashes, now)
            # an HTTP server's blocks are a usage scale, not blocks: it gives its size apart
            self.placement.set_capacity(backend.pid, getattr(
                backend, "kv_capacity_tokens", report.num_total_blocks * backend.info.block_size))
            if report.num_running == 0 and report.num_waiting == 0:
                self._on_idle()
        elif kind == "error":
            self._on_error(backend, env.error)
        elif kind == "health" and not env.health.reply:
            backend.send(codec.make_health(env.health.nonce, time.time(), reply=True))

    def _mark_up(self, backend: BackendConn, now: float) -> None:
        backend.last_seen = now
        if not backend.healthy:
            backend.healthy = True
            self._update_accepting(backend)
            self._on_idle()

    def _on_step(self, backend: BackendConn, decoded: codec.Decoded, now: float) -> None:
        if not backend.inflight:
            return  # nothing of ours there (late outputs of aborted requests): ignore
        self._fan_out(backend, decoded, now)
        if not backend.inflight:
            self._on_idle()  # its last request of ours finished: idle flush, no LoadReport wait

    def _fan_out(self, backend: BackendConn, decoded: codec.Decoded, now: float) -> None:
        """Hand each RequestOutput to its request. One output that cannot be read fails its own
        request; the others of the StepOutput are delivered."""
        for out in decoded.envelope.step_output.outputs:
            entry = backend.inflight.get(out.request_id)
            if entry is None:
                continue  # aborted or unknown: ignore
            try:
                self._deliver(backend, decoded, out, entry, now)
            except Exception as exc:
                log.exception("output for %s from %s unreadable", out.request_id, backend.address)
                self._fail_one(backend, out.request_id,
                               backend_error(f"The backend sent an unreadable output: {exc}",
                                             code="bad_backend_output"))

    def _deliver(self, backend: BackendConn, decoded: codec.Decoded, out: pb.RequestOutput,
                 entry: tuple[Dispatch, int], now: float) -> None:
        dispatch, generated = entry
        rid = out.request_id
        if out.finish_reason == pb.RequestOutput.ERROR:
            self._fail_one(backend, rid, backend_error("The backend failed the request."),
                           abort=False)
            return
        arr = codec.array_of(decoded, out.tokens_frame)
        ids = arr.tolist() if arr is not None else []
        if out.num_completion_tokens != generated + len(ids):
            # Outputs of one request travel in order on one connection; a count that does not
            # add up means a StepOutput was lost (dropped by a full queue, or garbled): the
            # text would silently miss tokens, so the request fails instead.
            self.num_gaps += 1
            self._fail_one(backend, rid, backend_error(
                f"Lost output from backend {backend.address}: expected token "
                f"{generated + len(ids)}, the backend reports {out.num_completion_tokens}.",
                code="output_gap"))
            return
        backend.inflight[rid] = (dispatch, generated + len(ids))
        # The charge is released at the finish (`_forget`), as in the simulator: a running
        # request holds a batch slot and its KV until then, so counting it whole is a stand-in
        # for what slows the backend's steps. Releasing one per token here (until the third
        # session) made least-loaded picks differ from the simulator's; releasing the prompt's
        # share at the first token made a hot prefix's holder look idle while it decoded a
        # batch 4x the others' (simulated 6.7B on H200: TPOT 13.6 vs 5.9 ms at 80 req/s).
        finish = FINISH_REASON_FROM_WIRE.get(out.finish_reason)
        if finish is not None:
            self._owner.pop(rid, None)
            self._forget(backend, rid)
        lps = [(lp.logprob, list(lp.top_ids), list(lp.top_logprobs)) for lp in out.logprobs] \
            if out.logprobs else None
        if out.num_cached_tokens or out.pin_status:  # prefix cache and pin (issue 30)
            on_cache = getattr(dispatch.sink, "on_cache", None)
            if on_cache is not None:
                on_cache(out.num_cached_tokens, out.pin_status)
            if out.pin_status == pb.RequestOutput.PIN_OVER_BUDGET and dispatch.session is not None:
                sessions = getattr(self.placement, "sessions", None)
                if sessions is not None:  # it holds no pin: placement must not prefer it for one
                    sessions.drop_pin(dispatch.session, backend.pid)
        if out.num_draft_tokens or out.num_accepted_prediction_tokens or \
                out.num_rejected_prediction_tokens:
            on_spec = getattr(dispatch.sink, "on_speculation", None)
            if on_spec is not None:
                on_spec(out.num_draft_tokens, out.num_accepted_draft_tokens,
                        out.num_accepted_prediction_tokens, out.num_rejected_prediction_tokens)
        if out.text:  # a backend that detokenizes for the gateway (gateway.http_backend)
            dispatch.sink.on_tokens(ids, finish, lps, now, text=out.text)
        else:
            dispatch.sink.on_tokens(ids, finish, lps, now)

    def _fail_one(self, backend: BackendConn, rid: str, error: APIError,
                  abort: bool = True) -> None:
        """Fail one in-flight request (and, unless the backend ended it, abort it there)."""
        self._owner.pop(rid, None)
        dispatch = self._forget(backend, rid)
        if abort:
            self._send_abort(backend, [rid])
        if dispatch is not None:
            dispatch.sink.on_error(error)

    def _on_error(self, backend: BackendConn, err: pb.Error) -> None:
        if err.request_id:
            self._owner.pop(err.request_id, None)
            dispatch = self._forget(backend, err.request_id)
            if dispatch is not None:
                dispatch.sink.on_error(error_from_backend(err))
            return
        log.warning("backend %s reports: %s (%s)", backend.address, err.message,
                    pb.Error.Code.Name(err.code))
        if err.code == pb.Error.VERSION_MISMATCH:
            self._mark_down(backend, f"protocol version mismatch: {err.message}")
        elif err.code in (pb.Error.BAD_MESSAGE, pb.Error.INTERNAL):
            # An Error naming no request answers a message the backend could not read or
            # handle. Batches are the only messages that start work. Its requests that have
            # no output yet fail (and are aborted, in case some were admitted) rather than
            # wait for their timeout; those producing tokens were admitted and carry on.
            if err.batch_id:  # the backend names the Batch: exactly its requests
                named = [rid for rid, (d, n) in backend.inflight.items()
                         if n == 0 and d.batch_id == err.batch_id]
            elif backend.info is not None and codec.echoes_batch_ids(
                    backend.info.protocol_version):
                # A 1.1 backend names the Batch whenever the message was one (the id leads
                # the message): this one was not, and no request of ours is concerned.
                named = []
            else:  # a 1.0 backend cannot say which Batch: every one not yet confirmed
                named = [rid for rid, (_, n) in backend.inflight.items() if n == 0]
            for rid in named:
                self._fail_one(backend, rid, error_from_backend(err))

