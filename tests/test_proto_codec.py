"""Round trips, limits and helpers of proto.codec (examples; properties are in test_proto_props.py)."""

import numpy as np
import pytest
import zmq

from proto import codec
from proto import tidegate_pb2 as pb
from proto.codec import DecodeError, VersionMismatch, decode, encode


def _tokens(*values):
    return np.array(values, dtype="<i4")


def sample_envelopes():
    """One fully populated envelope per body type, with the arrays it refers to."""
    info = pb.BackendInfo(
        protocol_version="1.0", model="deepseek-coder-1.3b", max_model_len=16384, vocab_size=32256,
        block_size=16, num_kv_blocks=4096, role=pb.BackendInfo.DECODE, tokenizer_json='{"model": {}}',
        chat_template="{{ messages }}", bos_token_id=32013, eos_token_ids=[32014, 32021],
        backend_id="gpu0", max_num_seqs=256,
    )
    sampling = pb.SamplingParams(max_tokens=64, temperature=0.7, top_p=0.95, top_k=50, seed=1234,
                                 stop_token_ids=[2, 3], ignore_eos=True, logprobs=5, stop=["\n\n"])
    batch = pb.Batch(requests=[
        pb.GenerateRequest(request_id="r0", prompt_frame=0, sampling=sampling, queue_class=pb.SLOW,
                           priority=-3, arrival_time=1700000000.25, deadline=1700000005.0),
        pb.GenerateRequest(request_id="r1", prompt_frame=1, queue_class=pb.FAST),
        pb.GenerateRequest(request_id="r2", prompt_frame=codec.NO_FRAME, prompt_text="def f():"),
    ])
    step = pb.StepOutput(step=42, outputs=[
        pb.RequestOutput(request_id="r0", tokens_frame=0, finish_reason=pb.RequestOutput.NONE,
                         num_prompt_tokens=3, num_completion_tokens=1, num_cached_tokens=2,
                         logprobs=[pb.TokenLogprobs(logprob=-0.5, top_ids=[7, 8], top_logprobs=[-0.5, -1.5])]),
        pb.RequestOutput(request_id="r1", tokens_frame=codec.NO_FRAME,
                         finish_reason=pb.RequestOutput.ABORT),
    ])
    load = pb.LoadReport(num_running=12, num_waiting=3, num_free_blocks=100, num_total_blocks=4096,
                         recent_step_time_ms=17.5, backend_id="gpu0", num_outstanding_tokens=10**10)
    return {
        "hello": (codec.make_hello("gw-1", pb.Hello.GATEWAY), []),
        "backend_info": (pb.Envelope(backend_info=info), []),
        "batch": (pb.Envelope(batch=batch), [_tokens(1, 2, 3), [4, 5]]),
        "abort": (codec.make_abort(["r0", "r1"]), []),
        "step_output": (pb.Envelope(step_output=step), [_tokens(9)]),
        "load_report": (pb.Envelope(load_report=load), []),
        "error": (codec.make_error(pb.Error.CAPACITY, "queue full", "r9"), []),
        "health": (codec.make_health(7, 12.5, reply=True), []),
        # prefix pull (issue 34): the prompt as a token array; the blocks as raw frames (here
        # 16 bytes, a multiple of 4 as every block row is)
        "kv_pull": (pb.Envelope(kv_pull=pb.KvPull(pull_id=3, prompt_frame=0, start_block=2,
                                                  max_blocks=5, layout="m|auto|bs16")),
                    [_tokens(1, 2, 3)]),
        "kv_blocks": (pb.Envelope(kv_blocks=pb.KvBlocks(pull_id=3, start_block=2, num_blocks=1,
                                                        block_bytes=16, num_frames=1,
                                                        layout="m|auto|bs16",
                                                        frame_crc32=[123])), [_tokens(1, 2, 3, 4)]),
        # the puller's release of blocks lent by CUDA IPC (backend.kv.cuda_ipc)
        "kv_release": (pb.Envelope(kv_release=pb.KvRelease(pull_id=3)), []),
    }


def test_every_body_type_is_covered():
    bodies = {f.name for f in pb.Envelope.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert bodies == set(sample_envelopes())


@pytest.mark.parametrize("kind", sorted(sample_envelopes()))
def test_round_trip_every_message(kind):
    envelope, arrays = sample_envelopes()[kind]
    frames = encode(envelope, arrays)
    assert all(isinstance(f, bytes) for f in frames)
    assert len(frames) == 1 + len(arrays)
    decoded = decode(frames)
    assert decoded.kind == kind
    assert decoded.envelope == envelope
    assert len(decoded.arrays) == len(arrays)
    for got, want in zip(decoded.arrays, arrays):
        assert got.dtype == np.dtype("<i4")
        np.testing.assert_array_equal(got, np.asarray(want))


def test_optional_fields_keep_presence():
    envelope, arrays = sample_envelopes()["batch"]
    decoded = decode(encode(envelope, arrays)).envelope
    assert decoded.batch.requests[0].sampling.HasField("seed")
    assert not decoded.batch.requests[1].sampling.HasField("seed")
    info = decode(encode(pb.Envelope(backend_info=pb.BackendInfo(bos_token_id=0)))).envelope
    assert info.backend_info.HasField("bos_token_id") and info.backend_info.bos_token_id == 0


def test_backend_info_max_num_seqs_round_trips_and_reads_zero_when_unset():
    """BackendInfo.max_num_seqs (issue 31): the slot model's concurrency at start. A peer from
    before it sends none, which reads 0 = unknown (the gateway measures it instead)."""
    info = decode(encode(pb.Envelope(backend_info=pb.BackendInfo(max_num_seqs=8)))).envelope
    assert info.backend_info.max_num_seqs == 8
    old = pb.BackendInfo(model="m", block_size=16)  # what a 1.3 backend before it sends
    assert decode(encode(pb.Envelope(backend_info=old))).envelope.backend_info.max_num_seqs == 0
    assert pb.BackendInfo.DESCRIPTOR.fields_by_name["max_num_seqs"].number == 16


def test_frames_are_raw_little_endian_int32():
    frames = encode(codec.make_abort([]), [[1, -1, 2**31 - 1]])
    assert frames[1] == b"\x01\x00\x00\x00" + b"\xff\xff\xff\xff" + b"\xff\xff\xff\x7f"


def test_decode_does_not_copy_bytes_memoryview_or_zmq_frames():
    envelope, arrays = sample_envelopes()["batch"]
    frames = encode(envelope, arrays)
    decoded = decode(frames)
    assert decoded.arrays[0].base is not None and not decoded.arrays[0].flags.owndata
    buf = bytearray(frames[1])
    mutable = decode([frames[0], memoryview(buf), frames[2]])
    buf[0] = 99  # a view sees writes to the buffer it was made from
    assert mutable.arrays[0][0] == 99
    zframes = [zmq.Frame(f) for f in frames]
    zdecoded = decode(zframes)
    assert np.shares_memory(zdecoded.arrays[1], np.frombuffer(zframes[2].buffer, dtype=np.uint8))


def test_decode_over_a_real_zmq_pair_without_copy():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://proto-test")
        b.connect("inproc://proto-test")
        envelope, arrays = sample_envelopes()["step_output"]
        a.send_multipart(encode(envelope, arrays))
        decoded = decode(b.recv_multipart(copy=False))
        assert decoded.envelope == envelope
        np.testing.assert_array_equal(decoded.arrays[0], [9])
    finally:
        a.close(0)
        b.close(0)


def test_encode_accepts_lists_and_integer_arrays_of_any_width():
    frames = encode(codec.make_abort([]), [[], [5], np.arange(3, dtype=np.int64), np.arange(2, dtype=np.uint16)])
    arrays = decode(frames).arrays
    assert [a.tolist() for a in arrays] == [[], [5], [0, 1, 2], [0, 1]]


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1], [1.5], [[1, 2]], [True], ["a"]])
def test_encode_rejects_arrays_that_are_not_int32(bad):
    with pytest.raises(ValueError):
        encode(codec.make_abort([]), [bad])


def test_encode_rejects_bodiless_envelopes_and_dangling_indexes():
    with pytest.raises(ValueError, match="no body"):
        encode(pb.Envelope())
    batch = pb.Envelope(batch=pb.Batch(requests=[pb.GenerateRequest(request_id="x", prompt_frame=1)]))
    with pytest.raises(ValueError, match="prompt_frame=1"):
        encode(batch, [[1]])


# ---- decode errors: DecodeError and nothing else ----------------------------------------------

def _valid_frames():
    envelope, arrays = sample_envelopes()["batch"]
    return encode(envelope, arrays)


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b""], "no body"),
    ([b"\xff\xff\xff"], "garbled"),
    ([b"\x0a\x05\x0a"], "garbled"),  # hello field claims 5 bytes, has 1
    (None, "sequence"),
    ([object()], "bytes-like"),
])
def test_malformed_envelopes_raise_decode_error(frames, match):
    with pytest.raises(DecodeError, match=match):
        decode(frames)


def test_truncated_envelope_raises_decode_error():
    frame0 = _valid_frames()[0]
    for cut in range(1, len(frame0)):
        try:
            decode([frame0[:cut]])
        except DecodeError:
            pass  # either garbled or (rarely) a valid prefix with a body; both fine


def test_odd_length_array_frame_raises_decode_error():
    frames = _valid_frames()
    frames[1] = frames[1][:-1]
    with pytest.raises(DecodeError, match="multiple of 4"):
        decode(frames)


def test_missing_array_frame_raises_decode_error():
    frames = _valid_frames()
    with pytest.raises(DecodeError, match="prompt_frame=1"):
        decode(frames[:2])


def test_out_of_range_tokens_frame_raises_decode_error():
    step = pb.Envelope(step_output=pb.StepOutput(outputs=[pb.RequestOutput(request_id="a", tokens_frame=-2)]))
    with pytest.raises(DecodeError, match="tokens_frame=-2"):
        decode([step.SerializeToString()])


def test_oversized_frames_and_too_many_frames_raise_decode_error():
    frames = _valid_frames()
    with pytest.raises(DecodeError, match="limit"):
        decode(frames, max_frame_bytes=8)
    with pytest.raises(DecodeError, match="too many frames"):
        decode(frames, max_frames=2)
    big = [codec.make_abort([]).SerializeToString(), bytes(codec.MAX_FRAME_BYTES + 4)]
    with pytest.raises(DecodeError, match="limit"):
        decode(big)
    with pytest.raises(DecodeError, match="too many frames"):
        decode([frames[0]] + [b""] * codec.MAX_FRAMES)


def test_decode_error_is_a_value_error():
    assert issubclass(DecodeError, ValueError) and issubclass(VersionMismatch, DecodeError)


# ---- helpers -------------------------------------------------------------------------------------

def test_array_of():
    decoded = decode(_valid_frames())
    np.testing.assert_array_equal(codec.array_of(decoded, 1), [4, 5])
    assert codec.array_of(decoded, codec.NO_FRAME) is None
    for bad in (2, -2, 100):
        with pytest.raises(DecodeError, match="out of range"):
            codec.array_of(decoded, bad)


def test_version_check():
    codec.check_version(codec.PROTOCOL_VERSION)
    codec.check_version("1.7")  # another minor is fine
    for bad in ("2.0", "0.9", "10.0"):
        with pytest.raises(VersionMismatch, match="major versions differ"):
            codec.check_version(bad)
    for bad in ("", "1", "1.x", "v1.0", "1.0.0", " 1.0"):
        with pytest.raises(VersionMismatch, match="malformed"):
            codec.check_version(bad)
    assert codec.parse_version(codec.PROTOCOL_VERSION) == (1, 3)  # 1.1: batch_id; 1.2: speculation; 1.3: KV pull


def test_hello_with_another_major_is_refused_with_a_clear_error():
    hello = codec.make_hello("old-gw", pb.Hello.GATEWAY)
    hello.hello.protocol_version = "2.3"
    received = decode(encode(hello)).envelope.hello
    with pytest.raises(VersionMismatch) as exc_info:
        codec.check_version(received.protocol_version)
    reply = decode(encode(codec.error_for(exc_info.value))).envelope.error
    assert reply.code == pb.Error.VERSION_MISMATCH
    assert "2.3" in reply.message and codec.PROTOCOL_VERSION in reply.message


def test_error_for_a_bad_message():
    with pytest.raises(DecodeError) as exc_info:
        decode([b"\xff"])
    reply = codec.error_for(exc_info.value).error
    assert reply.code == pb.Error.BAD_MESSAGE and "garbled" in reply.message


def test_queue_class_values_match_the_scheduler():
    from scheduler.classes import QueueClass

    for cls in QueueClass:
        assert pb.QueueClass.Value(cls.name) == int(cls)


def test_encode_trusted_makes_the_same_frames_as_encode():
    """The fast path for self-built messages must be byte-identical to `encode`, fall back to it
    for numpy arrays, and keep its refusal of values outside int32."""
    import numpy as np
    import pytest

    env = pb.Envelope(step_output=pb.StepOutput(step=3, outputs=[
        pb.RequestOutput(request_id="a", tokens_frame=0), pb.RequestOutput(request_id="b", tokens_frame=1)]))
    lists = [[1, 2, -3, 2**31 - 1], []]
    assert codec.encode_trusted(env, lists) == codec.encode(env, lists)
    as_numpy = [np.array(t, dtype=np.int64) for t in lists]
    assert codec.encode_trusted(env, as_numpy) == codec.encode(env, lists)
    with pytest.raises(ValueError):
        codec.encode_trusted(env, [[2**31], []])


def test_encode_trusted_refuses_an_oversized_message_as_encode_does(monkeypatch):
    """The client builds its requests with encode_trusted: a prompt over the frame limit must
    still fail at the client (ValueError), not be sent for the server to drop unanswered."""
    import pytest

    monkeypatch.setattr(codec, "MAX_FRAME_BYTES", 64)
    env = pb.Envelope(batch=pb.Batch(requests=[pb.GenerateRequest(request_id="r", prompt_frame=0)]))
    assert len(codec.encode_trusted(env, [list(range(16))])[1]) == 64  # at the limit: sent
    with pytest.raises(ValueError, match="exceeds limits"):
        codec.encode_trusted(env, [list(range(17))])


@pytest.mark.parametrize("batch_id", [1, 127, 128, 2**35 + 3, 2**64 - 1])
def test_batch_id_leads_the_message_and_survives_a_garbled_rest(batch_id):
    env = pb.Envelope(batch=pb.Batch(batch_id=batch_id))
    env.batch.requests.add(request_id="r", prompt_frame=0)
    frames = codec.encode(env, [[1, 2, 3]])
    assert codec.encode_trusted(env, [[1, 2, 3]]) == frames
    decoded = codec.decode(frames)  # the repeated head merges into the one Batch
    assert decoded.envelope.batch.batch_id == batch_id
    assert [r.request_id for r in decoded.envelope.batch.requests] == ["r"]
    assert codec.peek_batch_id(frames) == batch_id
    head = frames[0][:3 + len(codec._varint(batch_id))]
    garbled = [head + b"\xff" * 12]
    with pytest.raises(codec.DecodeError):
        codec.decode(garbled)
    assert codec.peek_batch_id(garbled) == batch_id  # what the receiver can still name


def test_peek_batch_id_is_zero_for_anything_else():
    assert codec.peek_batch_id(codec.encode(pb.Envelope(batch=pb.Batch()))) == 0  # a 1.0 sender
    assert codec.peek_batch_id(codec.encode(codec.make_abort(["a"]))) == 0
    for frames in ([], [b""], [b"\x1a"], [b"\x1a\x0b\x10" + b"\xff" * 10], [object()]):
        assert codec.peek_batch_id(frames) == 0
    assert codec.echoes_batch_ids(codec.PROTOCOL_VERSION)
    assert not codec.echoes_batch_ids("1.0") and not codec.echoes_batch_ids("junk")


def test_prediction_frame_and_speculation_fields_round_trip():
    req = pb.GenerateRequest(request_id="r", prompt_frame=0, prediction_frame=1,
                             speculation=pb.SpeculationParams(off=False, max_draft_tokens=5))
    frames = encode(pb.Envelope(batch=pb.Batch(requests=[req])), [[1, 2, 3], [7, 8]])
    decoded = decode(frames)
    got = decoded.envelope.batch.requests[0]
    assert got.HasField("prediction_frame") and got.speculation.max_draft_tokens == 5
    np.testing.assert_array_equal(codec.array_of(decoded, got.prediction_frame), [7, 8])
    # unset prediction_frame means "no prediction" (not array 0)
    plain = decode(encode(pb.Envelope(batch=pb.Batch(requests=[pb.GenerateRequest(
        request_id="p", prompt_frame=0)])), [[1]])).envelope.batch.requests[0]
    assert not plain.HasField("prediction_frame") and not plain.speculation.off
    out = pb.RequestOutput(request_id="r", tokens_frame=-1, num_draft_tokens=9,
                           num_accepted_prediction_tokens=4, num_rejected_prediction_tokens=2,
                           num_accepted_draft_tokens=6)
    back = decode(encode(pb.Envelope(step_output=pb.StepOutput(outputs=[out])))).envelope
    o = back.step_output.outputs[0]
    assert (o.num_draft_tokens, o.num_accepted_prediction_tokens, o.num_rejected_prediction_tokens,
            o.num_accepted_draft_tokens) == (9, 4, 2, 6)


def test_dangling_prediction_frame_is_a_decode_error():
    req = pb.GenerateRequest(request_id="r", prompt_frame=0, prediction_frame=3)
    envelope = pb.Envelope(batch=pb.Batch(requests=[req]))
    with pytest.raises(ValueError, match="prediction_frame=3"):
        encode(envelope, [[1, 2, 3]])
    frames = [envelope.SerializeToString(), np.array([1, 2, 3], "<i4").tobytes()]
    with pytest.raises(DecodeError, match="prediction_frame=3"):
        decode(frames)
