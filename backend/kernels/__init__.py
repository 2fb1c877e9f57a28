"""Triton kernels for the CUDA path, each beside its torch reference (the oracle).

Every public function dispatches: Triton when the tensor is on CUDA and Triton imports, else the
torch reference, so CPU callers get identical semantics (tests/test_kernels_reference.py checks the
references against float64 math; tests/test_kernels_gpu.py checks Triton against the references).

Import from the modules (this package re-exports nothing, so that a module and its main function
can share a name):

    paged_attention         paged_attention(q, k_cache, v_cache, block_tables, query_start_loc,
                                            context_lens, scale, max_query_len=...,
                                            max_context_len=None): decodes and prefill chunks
                            in one launch over bf16 / fp8 / int4-fp8 pages
    rmsnorm                 rms_norm(x, weight, eps); fused_add_rms_norm(x, residual, weight, eps)
    rotary_kv               build_rope_cache(...); rotary_kv_write(positions, q, k, v, cos, sin,
                                                                   k_cache, v_cache, slot_mapping)
                            (quantizes on write into fp8 / int4 pools)
    silu_mul                silu_and_mul(gate_up)
    fp8_gemv                quantize_fp8_per_channel(w); fp8_gemv(x, w_fp8, scale);
                            fp8_linear(x, w_fp8, scale); check_fp8_support(device);
                            one row with the op before it folded in (Triton only):
                            gemv_silu_mul_triton(gate_up, w, scale, config),
                            gemv_rms_norm_triton(x, residual, norm_w, eps, w, scale, config)
"""
