"""Same process, alternating: CpuAttention on one chunk after a cached prefix, the fused path
(CONTINUED_MIN_QUERY=32) vs the paged kernel (threshold off); and a fresh prefill of the whole
context for scale. bf16, one thread, min of 5."""
import time

import torch

import backend.kernels.cpu.attention as A
from backend.kernels.forward_context import ForwardContext

torch.manual_seed(0); torch.set_num_threads(1)
def case(H, Hkv, D, qlen, ctx, bs=16, dt=torch.bfloat16):
    nb = -(-ctx // bs)
    kc = torch.randn(nb + 4, bs, Hkv, D, dtype=dt); vc = torch.randn_like(kc)
    table = torch.randperm(nb + 4)[:nb].to(torch.int32)[None]
    def fc(q_len):
        pos = torch.arange(ctx - q_len, ctx)
        slots = table[0].long()[pos // bs] * bs + pos % bs
        return ForwardContext(positions=pos, slot_mapping=slots, block_tables=table,
            context_lens=torch.tensor([ctx], dtype=torch.int32),
            query_start_loc=torch.tensor([0, q_len], dtype=torch.int32), num_decode_tokens=0,
            num_prefills=1, num_prefill_tokens=q_len, query_start_loc_host=[0, q_len],
            context_lens_host=[ctx], max_context_len=ctx, block_size=bs)
    att = A.CpuAttention(D ** -0.5)
    res = {}
    for name, ql, lim in (("fused", qlen, 32), ("paged", qlen, 10**9), ("fresh", ctx, 32)):
        res[name] = []
    for _ in range(5):
        for name, ql, lim in (("fused", qlen, 32), ("paged", qlen, 10**9), ("fresh", ctx, 32)):
            A.CONTINUED_MIN_QUERY = lim
            q = torch.randn(ql, H, D, dtype=dt); k = torch.randn(ql, Hkv, D, dtype=dt); v = torch.randn_like(k)
            f = fc(ql); s = time.perf_counter(); att(q, k, v, kc, vc, f); res[name].append(time.perf_counter() - s)
    print(f"heads {H}/{Hkv}x{D}, {qlen} tokens after {ctx - qlen}: fused {min(res['fused'])*1e3:.2f} ms, "
          f"paged {min(res['paged'])*1e3:.2f} ms (x{min(res['paged'])/min(res['fused']):.1f}); "
          f"fresh {ctx}: {min(res['fresh'])*1e3:.2f} ms", flush=True)
for H, Hkv, D in ((16, 16, 128), (6, 2, 64)):
    for ql, ctx in ((32, 1024), (64, 1024), (254, 1006), (954, 2048), (1024, 4096)):
        case(H, Hkv, D, ql, ctx)
