"""The host tier's block copies (backend.kv.host_tier, backend.kernels.block_gather): whole blocks of
every layer move as one batch, in queue order, bytes exact, for every KV format."""
import os
import subprocess
import sys

import pytest
import torch

from backend.config import ModelConfig
from backend.kernels import block_gather as bg
from backend.kv.host_tier import HostKVCache, copy_batches, host_runs
from backend.kv.pools import KVCache

TINY = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                   rope_theta=1e4, rope_scaling_factor=1.0, max_position_embeddings=64,
                   tie_word_embeddings=False, bos_token_id=None, eos_token_ids=(),
                   torch_dtype="float32")


def filled_cache(fmt: str, num_blocks: int, device: str, seed: int = 0) -> KVCache:
    """A pool whose every block holds distinct random K/V (quantized on write)."""
    kv = KVCache.allocate(TINY, num_blocks, 4, torch.float32, device, kv_cache_dtype=fmt)
    g = torch.Generator(device=device).manual_seed(seed)
    slots = torch.arange(num_blocks * 4, device=device)
    for pool in (*kv.k_caches, *kv.v_caches):
        x = torch.randn((num_blocks * 4, 2, 64), generator=g, device=device)
        if isinstance(pool, torch.Tensor):
            pool.view(-1, 2, 64).copy_(x)
        else:
            pool.write(slots, x)
    return kv


def block_bytes_of(kv: KVCache, block: int) -> list[torch.Tensor]:
    out = []
    for pool in (*kv.k_caches, *kv.v_caches):
        for t in ([pool] if isinstance(pool, torch.Tensor) else [pool.data.view(torch.uint8), pool.scale]):
            out.append(t[block].clone())
    return out


def test_batches_keep_queue_order_and_split_at_a_repeated_destination():
    copies = [("d2h", 1, 10), ("d2h", 2, 11), ("h2d", 10, 5), ("h2d", 11, 6), ("h2d", 12, 5),
              ("d2h", 3, 12)]
    assert list(copy_batches(copies, 8)) == [
        ("d2h", [(1, 10), (2, 11)]), ("h2d", [(10, 5), (11, 6)]), ("h2d", [(12, 5)]),
        ("d2h", [(3, 12)])]
    assert [len(b) for _, b in copy_batches([("d2h", i, i) for i in range(7)], 3)] == [3, 3, 1]
    with pytest.raises(ValueError):
        list(copy_batches([("x2y", 0, 0)], 4))


def test_runs_of_consecutive_host_blocks():
    assert host_runs([4, 5, 6, 9, 10, 2]) == [(0, 4, 3), (3, 9, 2), (5, 2, 1)]
    assert host_runs([]) == []


@pytest.mark.parametrize("fmt", ["auto", "fp8", "int4-fp8"])
def test_blocks_saved_and_loaded_back_are_byte_exact(fmt):
    kv = filled_cache(fmt, 12, "cpu")
    before = {b: block_bytes_of(kv, b) for b in range(12)}
    host = HostKVCache(kv, 8, bg.BlockGather)
    # save 3, 7, 1 to host 5, 6, 0; then, in the same queue, load host 6 and 5 into 9 and 2 and
    # save 9 (now block 7's bytes) to host 3
    host.run([("d2h", 3, 5), ("d2h", 7, 6), ("d2h", 1, 0), ("h2d", 6, 9), ("h2d", 5, 2),
              ("d2h", 9, 3)])
    assert host.num_copies == 6
    for b, want in [(9, 7), (2, 3), (0, 0), (7, 7)]:
        assert all(torch.equal(x, y) for x, y in zip(block_bytes_of(kv, b), before[want]))
    for t, pool_bytes in enumerate(before[7]):   # host 3 holds block 7's bytes, tensor by tensor
        assert torch.equal(host.host_block(3, t).reshape(-1).view(torch.uint8),
                           pool_bytes.reshape(-1).view(torch.uint8))


def _interpreted_gather_check():
    """Run in a TRITON_INTERPRET=1 process (Triton binds interpreted kernels at import)."""
    kv = filled_cache("int4-fp8", 6, "cpu", seed=1)
    pools = HostKVCache(kv, 2, bg.BlockGather).device_tensors
    g = bg.BlockGather(pools)
    assert g.use_kernel
    ids = torch.tensor([4, 0, 5])
    stage, ref = (torch.zeros((3, g.block_bytes), dtype=torch.uint8) for _ in range(2))
    g.gather(ids, stage)
    bg.gather_blocks_reference(pools, ids, ref)
    assert torch.equal(stage, ref) and stage.any()
    g.scatter(torch.tensor([1, 2, 3]), stage)
    for dst, src in [(1, 4), (2, 0), (3, 5)]:
        assert all(torch.equal(p[dst], p[src]) for p in pools)
    print("gather ok")


def test_gather_kernel_equals_the_reference_in_the_interpreter():
    pytest.importorskip("triton")
    code = "import tests.test_host_kv_copies as t; t._interpreted_gather_check()"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and "gather ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["auto", "fp8", "int4-fp8"])
def test_gpu_tier_round_trip_is_byte_exact_and_batched(fmt):
    kv = filled_cache(fmt, 40, "cuda")
    before = {b: block_bytes_of(kv, b) for b in range(40)}
    host = HostKVCache(kv, 64, bg.BlockGather)
    assert host.gather.use_kernel
    # 20 blocks out (host 30..49, one run), back into 20..39 in reverse order
    host.run([("d2h", b, 30 + b) for b in range(20)])
    host.run([("h2d", 30 + b, 39 - b) for b in range(20)])
    torch.cuda.synchronize()
    assert host.num_transfers == 2   # one copy each way
    for b in range(20):
        assert all(torch.equal(x, y) for x, y in zip(block_bytes_of(kv, 39 - b), before[b]))
