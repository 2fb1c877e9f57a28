"""`tidegate backend --waiting-by-class` (issue 31, fifteenth session): our engine admits its
waiting requests Fast first, as the gateway's admission and classes assume (the echo engine
always did); FCFS stays the default."""
from __future__ import annotations


def test_the_flag_reaches_the_engine_scheduler():
    from backend.engine.args import backend_config
    from backend.engine.assemble import engine_config
    from backend.server.cli import serve_parser

    class Runner:
        max_model_len = 256

        class kv:
            num_blocks = 64

    on = backend_config(serve_parser().parse_args(["--waiting-by-class"]))
    off = backend_config(serve_parser().parse_args([]))
    assert on.waiting_by_class and not off.waiting_by_class
    assert engine_config(on, Runner, None).scheduler_config().waiting_by_class
    assert not engine_config(off, Runner, None).scheduler_config().waiting_by_class


def test_serve_forwards_the_flag_to_its_backend():
    from gateway.serve import build_parser, embedded_backend_argv

    argv = embedded_backend_argv(build_parser().parse_args(["--waiting-by-class"]),
                                 "ipc:///tmp/z.sock")
    assert "--waiting-by-class" in argv


def _first_token_order(by_class: bool, async_turns: bool = False) -> list[str]:
    """The tiny model on the CPU, one prefill a step (budget 16 tokens): Slow, Slow, Slow,
    then Fast waiting; the order their first tokens come out in (`async_turns`: the CUDA
    engine's pipelined turns, `advance`)."""
    from backend.engine.assemble import BackendConfig, create_engine
    from backend.runner.sampler import SamplingParams

    e, _ = create_engine(BackendConfig(model="tiny", num_blocks=64, block_size=4, max_num_seqs=8,
                                       max_num_batched_tokens=16, max_model_len=256,
                                       waiting_by_class=by_class))
    e.async_scheduling = async_turns
    turn = e.advance if async_turns else e.step
    order: list[str] = []
    for rid, max_tokens in (("slow0", 100), ("slow1", 100), ("slow2", 100), ("fast", 4)):
        assert e.add_request(rid, [5 + len(order)] * 12,
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True)) is None
    for _ in range(10):
        for o in turn():
            if o.new_token_ids and o.request_id not in order:
                order.append(o.request_id)
    e.check_integrity()
    return order


def test_fast_starts_first_by_class_and_last_fcfs():
    for async_turns in (False, True):
        assert _first_token_order(False, async_turns) == ["slow0", "slow1", "slow2", "fast"]
        assert _first_token_order(True, async_turns) == ["fast", "slow0", "slow1", "slow2"]
