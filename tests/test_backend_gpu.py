"""The engine on CUDA (skipped without a GPU): the same tokens as the CPU in float32, sane in bf16."""
import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams

pytestmark = pytest.mark.gpu


def _generate(device, dtype, prompts, max_tokens=24):
    engine, _ = create_engine(BackendConfig(model="tiny", device=device, dtype=dtype, num_blocks=256,
                                            max_num_seqs=8, max_num_batched_tokens=64, seed=1))
    if device != "cpu":  # dummy weights are deterministic per device: use the CPU's
        cpu_engine, _ = create_engine(BackendConfig(model="tiny", num_blocks=16, seed=1))
        with torch.no_grad():
            for (_, dst), (_, src) in zip(engine.runner.model.named_parameters(),
                                          cpu_engine.runner.model.named_parameters()):
                dst.copy_(src)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        assert engine.add_request(str(i), p, params) is None
    out = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    engine.check_integrity()
    return out


PROMPTS = [[256, 1, 2, 3], list(range(256, 200, -1)) + [256], [256] + list(range(90))]


def test_cuda_float32_matches_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    assert _generate("cuda", "float32", PROMPTS) == _generate("cpu", "float32", PROMPTS)


def test_cuda_bfloat16_runs_and_mostly_agrees():
    cpu = _generate("cpu", "float32", PROMPTS)
    bf16 = _generate("cuda", "bfloat16", PROMPTS)
    for rid in cpu:
        assert len(bf16[rid]) == 24
        assert bf16[rid][:4] == cpu[rid][:4]


def test_33b_preset_on_the_gpu_loads_and_decodes():
    engine, loaded = create_engine(BackendConfig(model="deepseek-coder-33b", device="cuda",
                                                 dtype="bfloat16", max_model_len=4096,
                                                 max_num_seqs=8, max_num_batched_tokens=2048))
    assert loaded.config.num_hidden_layers == 62
    engine.add_request("x", list(range(1, 300)), SamplingParams(max_tokens=4, ignore_eos=True))
    toks = []
    while engine.has_unfinished():
        for o in engine.step():
            toks.extend(o.new_token_ids)
    assert len(toks) == 4 and all(0 <= t < 32256 for t in toks)
