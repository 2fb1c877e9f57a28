"""The engine feeds the sampler's processors their history: penalties against transformers'
logits + the reference processor, min_tokens against stop tokens and EOS."""
import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams
from tests.backend_helpers import hf_model, make_checkpoint
from tests.test_backend_engine import prompts, run_all
from tests.test_backend_sampler_processors import reference_process


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("engine_proc"), "gqa4_tied_rope4")
    return path, hf_model(path)


def _engine(path):
    engine, loaded = create_engine(BackendConfig(model=str(path), block_size=4, num_blocks=128,
                                                 max_num_seqs=4, max_num_batched_tokens=24))
    return engine, loaded


def reference_greedy(hf, prompt, params, num_new):
    out: list[int] = []
    with torch.no_grad():
        for _ in range(num_new):
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].float().tolist()
            z = reference_process(logits, params, prompt, out, [])
            out.append(max(range(len(z)), key=lambda v: z[v]))
    return out


def test_penalized_greedy_matches_transformers_plus_the_reference(ckpt):
    path, hf = ckpt
    engine, loaded = _engine(path)
    ps = prompts(loaded.config.vocab_size, [6, 19], seed=3)
    params = SamplingParams(max_tokens=20, ignore_eos=True, repetition_penalty=1.4,
                            presence_penalty=0.3, frequency_penalty=0.2,
                            logit_bias=((7, 0.5),))
    out, _ = run_all(engine, {"a": ps[0], "b": ps[1]}, params)
    plain, _ = run_all(engine, {"a0": ps[0]}, SamplingParams(max_tokens=20, ignore_eos=True))
    for rid, prompt in zip("ab", ps):
        assert out[rid] == reference_greedy(hf, prompt, params, 20), rid
    assert out["a"] != plain["a0"]  # the penalties did change something


def test_min_tokens_holds_back_stop_tokens_and_eos(ckpt):
    path, _ = ckpt
    engine, loaded = _engine(path)
    prompt = prompts(loaded.config.vocab_size, [9], seed=4)[0]
    free, _ = run_all(engine, {"f": prompt}, SamplingParams(max_tokens=12, ignore_eos=True))
    stop = free["f"][0]
    out, fin = run_all(engine, {"s": prompt},
                       SamplingParams(max_tokens=12, stop_token_ids=(stop,)))
    assert out["s"] == [stop] and fin["s"].finish_reason == "stop"
    out, fin = run_all(engine, {"m": prompt},
                       SamplingParams(max_tokens=12, stop_token_ids=(stop,), min_tokens=6))
    assert len(out["m"]) >= 6 and stop not in out["m"][:6]
    # EOS counts as a stop id while min_tokens holds (not under ignore_eos)
    eos = engine.eos_token_ids[0]
    out, _ = run_all(engine, {"e": prompt},
                     SamplingParams(max_tokens=12, min_tokens=12, logit_bias=((eos, 100.0),)))
    assert eos not in out["e"] and len(out["e"]) == 12
    out, fin = run_all(engine, {"e2": prompt},
                       SamplingParams(max_tokens=12, min_tokens=3, logit_bias=((eos, 100.0),)))
    assert out["e2"][3] == eos and len(out["e2"]) == 4 and fin["e2"].finish_reason == "stop"


def test_bad_processor_values_refused(ckpt):
    path, _ = ckpt
    engine, _ = _engine(path)
    for params, words in [(SamplingParams(min_p=1.5), "min_p"),
                          (SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
                          (SamplingParams(max_tokens=4, min_tokens=5), "min_tokens"),
                          (SamplingParams(logit_bias=((10_000, 1.0),)), "logit_bias"),
                          (SamplingParams(presence_penalty=float("nan")), "finite")]:
        assert words in engine.add_request("x", [1, 2], params)
    assert not engine.has_unfinished()
