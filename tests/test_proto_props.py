"""Hypothesis properties of proto.codec: random messages round-trip; random bytes only raise DecodeError."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto import codec
from proto import tidegate_pb2 as pb
from proto.codec import DecodeError, decode, encode

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

i32 = st.integers(-(2**31), 2**31 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
f64 = st.floats(allow_nan=False)
f32 = st.floats(allow_nan=False, width=32)
text = st.text(max_size=20)
ids = st.lists(i32, max_size=8)

# Token arrays: empty, one token, and up to 100k tokens (built with numpy to stay fast).
token_arrays = st.one_of(
    st.just(np.empty(0, "<i4")),
    i32.map(lambda t: np.array([t], "<i4")),
    st.tuples(st.integers(0, 100_000), st.integers(0, 2**32 - 1)).map(
        lambda ns: np.random.default_rng(ns[1]).integers(-(2**31), 2**31, ns[0], dtype=np.int64).astype("<i4")
    ),
    st.lists(i32, max_size=50),
)


def _index(num_arrays):
    return st.integers(-1, num_arrays - 1)


sampling = st.builds(
    pb.SamplingParams, max_tokens=u32, temperature=f64, top_p=f64, top_k=i32,
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), stop_token_ids=ids,
    ignore_eos=st.booleans(), logprobs=u32, stop=st.lists(text, max_size=3),
)


def _requests(num_arrays):
    return st.lists(st.builds(
        pb.GenerateRequest, request_id=text, prompt_frame=_index(num_arrays), prompt_text=text,
        sampling=sampling, queue_class=st.sampled_from([pb.FAST, pb.NORMAL, pb.SLOW]), priority=i32,
        arrival_time=f64, deadline=f64,
    ), max_size=5)


def _outputs(num_arrays):
    logprobs = st.builds(pb.TokenLogprobs, logprob=f32, top_ids=ids, top_logprobs=st.lists(f32, max_size=8))
    return st.lists(st.builds(
        pb.RequestOutput, request_id=text, tokens_frame=_index(num_arrays),
        logprobs=st.lists(logprobs, max_size=3),
        finish_reason=st.sampled_from(pb.RequestOutput.FinishReason.values()),
        num_prompt_tokens=u32, num_completion_tokens=u32, num_cached_tokens=u32,
    ), max_size=5)


def _body(num_arrays):
    return st.one_of(
        st.builds(pb.Hello, protocol_version=text, peer_name=text,
                  role=st.sampled_from(pb.Hello.Role.values())).map(lambda m: pb.Envelope(hello=m)),
        st.builds(pb.BackendInfo, protocol_version=text, model=text, max_model_len=u32, vocab_size=u32,
                  block_size=u32, num_kv_blocks=u32, role=st.sampled_from(pb.BackendInfo.Role.values()),
                  tokenizer_json=text, chat_template=text, bos_token_id=st.one_of(st.none(), i32),
                  eos_token_ids=ids, backend_id=text).map(lambda m: pb.Envelope(backend_info=m)),
        _requests(num_arrays).map(lambda rs: pb.Envelope(batch=pb.Batch(requests=rs))),
        st.lists(text, max_size=5).map(codec.make_abort),
        st.builds(pb.StepOutput, step=u64, outputs=_outputs(num_arrays)).map(lambda m: pb.Envelope(step_output=m)),
        st.builds(pb.LoadReport, num_running=u32, num_waiting=u32, num_free_blocks=u32, num_total_blocks=u32,
                  recent_step_time_ms=f64, backend_id=text,
                  num_outstanding_tokens=u64).map(lambda m: pb.Envelope(load_report=m)),
        st.builds(codec.make_error, st.sampled_from(pb.Error.Code.values()), text, text),
        st.builds(codec.make_health, u64, f64, st.booleans()),
    )


@st.composite
def messages(draw):
    arrays = draw(st.lists(token_arrays, max_size=4))
    return draw(_body(len(arrays))), arrays


@PROPS
@given(messages())
def test_random_messages_round_trip(message):
    envelope, arrays = message
    decoded = decode(encode(envelope, arrays))
    assert decoded.envelope == envelope
    assert len(decoded.arrays) == len(arrays)
    for got, want in zip(decoded.arrays, arrays):
        assert got.dtype == np.dtype("<i4") and not got.flags.owndata
        np.testing.assert_array_equal(got, np.asarray(want, dtype=np.int64))


def _decode_only_raises_decode_error(frames):
    try:
        decoded = decode(frames)
    except DecodeError:
        return
    # Whatever decodes is consistent: a body is set and every array is int32.
    assert decoded.kind is not None
    assert all(a.dtype == np.dtype("<i4") for a in decoded.arrays)


@PROPS
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_random_bytes_only_raise_decode_error(frames):
    _decode_only_raises_decode_error(frames)


@PROPS
@given(messages(), st.data())
def test_corrupted_messages_only_raise_decode_error(message, data):
    frames = encode(*message)
    i = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[i])
    action = data.draw(st.sampled_from(["truncate", "flip", "insert", "drop_frame", "add_frame"]))
    if action == "truncate":
        frame = frame[: data.draw(st.integers(0, len(frame)))]
    elif action == "flip" and frame:
        for _ in range(data.draw(st.integers(1, 4))):
            frame[data.draw(st.integers(0, len(frame) - 1))] ^= data.draw(st.integers(1, 255))
    elif action == "insert":
        pos = data.draw(st.integers(0, len(frame)))
        frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    frames[i] = bytes(frame)
    if action == "drop_frame":
        del frames[i]
    elif action == "add_frame":
        frames.insert(i, data.draw(st.binary(max_size=16)))
    _decode_only_raises_decode_error(frames)


@PROPS
@given(st.lists(st.binary(max_size=32), min_size=1, max_size=4), st.integers(0, 40), st.integers(1, 5))
def test_limits_raise_decode_error(frames, max_frame_bytes, max_frames):
    try:
        decode(frames, max_frame_bytes=max_frame_bytes, max_frames=max_frames)
    except DecodeError:
        return
    assert len(frames) <= max_frames and max(map(len, frames)) <= max_frame_bytes
