"""Encode and decode tidegate's multipart ZMQ messages.

Frame layout of one message (ZMQ routing-identity frames are the socket's
business: a ROUTER strips them before ``decode`` and prepends them after ``encode``)::

    frame:   0                 1                 2                    N
           +----------------+ +---------------+ +---------------+    +---------------+
           | Envelope       | | int32 LE ids  | | int32 LE ids  | .. | int32 LE ids  |
           | (protobuf)     | | (raw bytes)   | | (raw bytes)   |    | (raw bytes)   |
           +----------------+ +---------------+ +---------------+    +---------------+
    array:                      0                 1                    N-1

Messages name a token array by its array index (``GenerateRequest.prompt_frame``,
``GenerateRequest.prediction_frame``, ``RequestOutput.tokens_frame``); ``NO_FRAME`` (-1) means none. ``decode`` checks
that every such index is in range, so ``decoded.arrays[i]`` is safe afterwards.

``decode`` raises ``DecodeError`` (a ``ValueError``) and nothing else, whatever
the bytes; the receiver answers with ``error_for(exc)`` and carries on.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from proto import tidegate_pb2 as pb

PROTOCOL_VERSION = "1.3"  # "MAJOR.MINOR"; peers with another MAJOR are refused
BATCH_IDS_SINCE = (1, 1)  # first version whose receivers echo Batch.batch_id in Error.batch_id
MAX_FRAME_BYTES = 64 << 20  # largest frame accepted (64 MiB)
MAX_FRAMES = 8192  # envelope + token arrays
NO_FRAME = -1  # array index meaning "no array"
TOKEN_DTYPE = np.dtype("<i4")


class DecodeError(ValueError):
    """A message could not be decoded. The only exception ``decode`` raises."""


class VersionMismatch(DecodeError):
    """The peer speaks another MAJOR protocol version (or an unreadable one)."""


class Decoded(NamedTuple):
    envelope: pb.Envelope
    arrays: list[np.ndarray]  # int32 views into the received frames (no copy)

    @property
    def kind(self) -> str:
        """Name of the body set in the envelope, e.g. ``"batch"``."""
        return self.envelope.WhichOneof("body")


# ---- encode -------------------------------------------------------------------------------

def encode(envelope: pb.Envelope, arrays: Iterable[Sequence[int] | np.ndarray] = ()) -> list[bytes]:
    """Serialize ``envelope`` and each token array into a list of frames.

    Arrays may be lists of ints or integer numpy arrays; values must fit in int32.
    Append an array and store its index in the message, e.g.
    ``req.prompt_frame = len(arrays); arrays.append(ids)``.
    Raises ``ValueError`` on a bodiless envelope, a bad array or a dangling index.
    """
    if envelope.WhichOneof("body") is None:
        raise ValueError("envelope has no body set")
    frames = [_serialize(envelope)]
    for i, tokens in enumerate(arrays):
        frames.append(_to_int32(tokens, i).tobytes())
    problem = _check_refs(envelope, len(frames) - 1)
    if problem:
        raise ValueError(problem)
    if len(frames) > MAX_FRAMES or max(map(len, frames)) > MAX_FRAME_BYTES:
        raise ValueError(f"message exceeds limits ({len(frames)} frames, {MAX_FRAME_BYTES} bytes/frame)")
    return frames


def _to_int32(tokens: Sequence[int] | np.ndarray, i: int) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.empty(0, TOKEN_DTYPE)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"array {i}: want a 1-D integer array, got {arr.dtype} of shape {arr.shape}")
    if arr.dtype != TOKEN_DTYPE:
        info = np.iinfo(np.int32)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"array {i}: values do not fit in int32")
        arr = arr.astype(TOKEN_DTYPE)
    return arr


# A Batch's id leads frame 0, so that it can be read when nothing after it parses:
#
#   0x1a <varint n>  0x10 <varint batch_id>   <the whole envelope, batch_id included>
#   \__ Envelope.batch (field 3), a 2-field-long Batch __/
#
# Protobuf merges repeated occurrences of a message field, so the receiver's parser sees one
# Batch (batch_id written twice, same value). Every receiver parses this; 1.0 ones ignore the id.
_BATCH_TAG, _BATCH_ID_TAG = 0x1A, 0x10


def _serialize(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    if envelope.WhichOneof("body") == "batch" and envelope.batch.batch_id:
        head = _varint(envelope.batch.batch_id)
        data = bytes((_BATCH_TAG, len(head) + 1, _BATCH_ID_TAG)) + head + data
    return data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def peek_batch_id(frames: Sequence) -> int:
    """The ``Batch.batch_id`` at the head of a message's frame 0 (see ``_serialize``), read
    without parsing the rest: a receiver that cannot decode the message still names the Batch
    in its ``Error``. 0 when the message does not start with one; never raises."""
    try:
        head = bytes(memoryview(frames[0])[:13])  # tag, length, tag, a 10-byte varint at most
    except Exception:  # noqa: BLE001 -- best effort by contract
        return 0
    if len(head) < 4 or head[0] != _BATCH_TAG or head[2] != _BATCH_ID_TAG:
        return 0
    value = shift = 0
    for byte in head[3:2 + head[1]]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value if value < 1 << 64 else 0
    return 0


def echoes_batch_ids(peer_version: str) -> bool:
    """Whether a peer of this protocol version names the Batch in its Errors (1.1 on)."""
    try:
        return parse_version(peer_version) >= BATCH_IDS_SINCE
    except VersionMismatch:
        return False


# ---- decode -------------------------------------------------------------------------------

# `array("i")` is little-endian int32 exactly when the host is little-endian with 4-byte ints.
_ARRAY_IS_WIRE_FORMAT = sys.byteorder == "little" and array("i").itemsize == 4


def encode_trusted(envelope: pb.Envelope, arrays: Iterable = ()) -> list[bytes]:
    """`encode` for messages a process builds itself (a body set, every frame index right by
    construction): plain lists of token ids are packed with `array` instead of one numpy
    conversion each, which cost more than the rest of a step's serialization. Anything else
    (numpy arrays, values outside int32, a big-endian host) goes through `encode` and its checks."""
    if not _ARRAY_IS_WIRE_FORMAT:
        return encode(envelope, arrays)
    frames = [_serialize(envelope)]
    try:
        for tokens in arrays:
            if type(tokens) is not list:
                return encode(envelope, arrays)
            frames.append(array("i", tokens).tobytes())
    except (OverflowError, TypeError):
        return encode(envelope, arrays)  # raises its ValueError
    if len(frames) > MAX_FRAMES or max(map(len, frames)) > MAX_FRAME_BYTES:
        return encode(envelope, arrays)  # raises its ValueError
    return frames


def decode(frames: Sequence, *, max_frame_bytes: int = MAX_FRAME_BYTES,
           max_frames: int = MAX_FRAMES) -> Decoded:
    """Parse a multipart message (bytes, memoryviews or ``zmq.Frame``s).

    Token arrays are ``np.frombuffer`` views sharing memory with the frames
    (read-only when the frames are ``bytes``).
    """
    try:
        num_frames = len(frames)
    except TypeError:
        raise DecodeError("frames must be a sequence") from None
    if num_frames == 0:
        raise DecodeError("empty message")
    if num_frames > max_frames:
        raise DecodeError(f"too many frames: {num_frames} > {max_frames}")
    views = [_view(f, i, max_frame_bytes) for i, f in enumerate(frames)]

    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(views[0])
    except Exception as exc:  # noqa: BLE001 -- the one-error-type promise beats precision
        raise DecodeError(f"garbled envelope: {exc}") from None
    if envelope.WhichOneof("body") is None:
        raise DecodeError("envelope has no body set")

    arrays = []
    for i, view in enumerate(views[1:], start=1):
        if view.nbytes % TOKEN_DTYPE.itemsize:
            raise DecodeError(f"frame {i}: {view.nbytes} bytes is not a multiple of 4")
        arrays.append(np.frombuffer(view, dtype=TOKEN_DTYPE))
    problem = _check_refs(envelope, len(arrays))
    if problem:
        raise DecodeError(problem)
    return Decoded(envelope, arrays)


def _view(frame, i: int, max_frame_bytes: int) -> memoryview:
    """A flat byte view of one frame (no copy)."""
    try:
        view = memoryview(frame)  # bytes, bytearray, memoryview, zmq.Frame, numpy arrays
        if not view.c_contiguous:
            raise DecodeError(f"frame {i}: buffer is not contiguous")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    except (TypeError, ValueError, BufferError) as exc:
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"frame {i}: not a bytes-like object ({type(frame).__name__})") from None
    if view.nbytes > max_frame_bytes:
        raise DecodeError(f"frame {i}: {view.nbytes} bytes > limit {max_frame_bytes}")
    return view


def _check_refs(envelope: pb.Envelope, num_arrays: int) -> str | None:
    """Describe the first array index in ``envelope`` that is out of range, if any."""
    kind = envelope.WhichOneof("body")
    if kind == "batch":
        refs = [(r.request_id, "prompt_frame", r.prompt_frame) for r in envelope.batch.requests]
        refs += [(r.request_id, "prediction_frame", r.prediction_frame)
                 for r in envelope.batch.requests if r.HasField("prediction_frame")]
    elif kind == "step_output":
        refs = ((o.request_id, "tokens_frame", o.tokens_frame) for o in envelope.step_output.outputs)
    elif kind == "kv_pull":  # issue 34: the prompt whose prefix blocks are wanted
        refs = [(f"pull {envelope.kv_pull.pull_id}", "prompt_frame", envelope.kv_pull.prompt_frame)]
    else:
        return None
    for request_id, field, index in refs:
        if index != NO_FRAME and not 0 <= index < num_arrays:
            return f"request {request_id!r}: {field}={index} but the message has {num_arrays} arrays"
    return None


def peek_request_ids(frames: Sequence) -> list[str]:
    """The request ids a message names, read from its envelope alone (for a message that
    failed to ``decode``, e.g. a dangling array index): the receiver can then fail exactly those
    requests. ``[]`` when even the envelope is unreadable; never raises."""
    try:
        envelope = pb.Envelope()
        envelope.ParseFromString(_view(frames[0], 0, MAX_FRAME_BYTES))
        kind = envelope.WhichOneof("body")
        if kind == "batch":
            return [r.request_id for r in envelope.batch.requests if r.request_id]
        if kind == "step_output":
            return [o.request_id for o in envelope.step_output.outputs if o.request_id]
        if kind == "abort":
            return []  # nothing to fail: the requests are being cancelled anyway
        if kind == "error" and envelope.error.request_id:
            return [envelope.error.request_id]
    except Exception:  # noqa: BLE001 -- best effort by contract; the caller logs
        return []
    return []


def array_of(decoded: Decoded, index: int) -> np.ndarray | None:
    """The token array at ``index``; ``None`` for ``NO_FRAME``; ``DecodeError`` if out of range."""
    if index == NO_FRAME:
        return None
    if not 0 <= index < len(decoded.arrays):
        raise DecodeError(f"array index {index} out of range (message has {len(decoded.arrays)})")
    return decoded.arrays[index]


# ---- versions and small constructors ---------------------------------------------------------

def parse_version(version: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` -> ``(major, minor)``; ``VersionMismatch`` if malformed."""
    major, dot, minor = version.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise VersionMismatch(f"malformed protocol version {version!r} (want MAJOR.MINOR)")
    return int(major), int(minor)


def check_version(peer_version: str) -> None:
    """Raise ``VersionMismatch`` unless ``peer_version`` has our MAJOR version."""
    if parse_version(peer_version)[0] != parse_version(PROTOCOL_VERSION)[0]:
        raise VersionMismatch(
            f"peer speaks protocol {peer_version}, this side speaks {PROTOCOL_VERSION} "
            "(major versions differ)"
        )


def make_hello(peer_name: str, role: int) -> pb.Envelope:
    """A ``Hello`` carrying our ``PROTOCOL_VERSION``; ``role`` is a ``pb.Hello.Role`` value."""
    return pb.Envelope(hello=pb.Hello(protocol_version=PROTOCOL_VERSION, peer_name=peer_name, role=role))


def make_error(code: int, message: str, request_id: str = "", batch_id: int = 0) -> pb.Envelope:
    """An ``Error`` envelope; ``code`` is a ``pb.Error.Code`` value."""
    return pb.Envelope(error=pb.Error(code=code, message=message, request_id=request_id,
                                      batch_id=batch_id))


def error_for(exc: DecodeError, batch_id: int = 0) -> pb.Envelope:
    """The ``Error`` to answer a message that failed to decode or a refused ``Hello``."""
    code = pb.Error.VERSION_MISMATCH if isinstance(exc, VersionMismatch) else pb.Error.BAD_MESSAGE
    return make_error(code, str(exc), batch_id=batch_id)


def make_abort(request_ids: Iterable[str]) -> pb.Envelope:
    return pb.Envelope(abort=pb.Abort(request_ids=list(request_ids)))


def make_health(nonce: int, time: float, reply: bool = False) -> pb.Envelope:
    """A ping (``reply=False``) or the pong answering it (same ``nonce``)."""
    return pb.Envelope(health=pb.Health(nonce=nonce, time=time, reply=reply))
