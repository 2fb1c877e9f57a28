"""GPU and interconnect specs: one table, datasheet and measured numbers side by side.

The roofline uses the *effective* figures (`bandwidth`, `bf16_flops`, `fp8_flops`): measured where we
have a measurement (H200: 4.28 TB/s copy bandwidth, ~790 TFLOP/s bf16 GEMM), otherwise the datasheet
figure scaled by the same measured/datasheet ratio as the H200 (marked `estimated=True`).
"""
from __future__ import annotations

from dataclasses import dataclass

TB = 1e12
GB = 1e9

# H200 measured / datasheet ratios, used to estimate effective figures of GPUs we have not measured.
_BW_EFF = 4.28 / 4.8
_FLOP_EFF = 790.0 / 989.0


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float            # HBM capacity
    datasheet_bandwidth: float     # bytes/s
    datasheet_bf16_flops: float    # dense FLOP/s
    datasheet_fp8_flops: float     # dense FLOP/s (0: no fp8 tensor cores -> bf16 rate)
    bandwidth: float               # effective bytes/s used by the roofline
    bf16_flops: float              # effective FLOP/s
    fp8_flops: float               # effective FLOP/s
    nvlink_bandwidth: float        # bytes/s per direction per GPU (0: none)
    pcie_bandwidth: float          # bytes/s per direction
    estimated: bool                # effective figures estimated, not measured

    def peak_flops(self, dtype: str) -> float:
        """Effective dense FLOP/s for matmuls in `dtype` ('bf16' | 'fp16' | 'fp8' | 'fp32')."""
        if dtype == "fp8":
            return self.fp8_flops or self.bf16_flops
        if dtype == "fp32":
            return self.bf16_flops / 2  # TF32 tensor cores: half the bf16 rate
        return self.bf16_flops


def _spec(name, mem_gb, bw_tb, bf16_tf, fp8_tf, nvlink_gb, pcie_gb, *, bw_meas=None, bf16_meas=None):
    bw = bw_meas * TB if bw_meas else bw_tb * TB * _BW_EFF
    bf16 = bf16_meas * TB if bf16_meas else bf16_tf * TB * _FLOP_EFF
    return GpuSpec(name=name, memory_bytes=mem_gb * GB, datasheet_bandwidth=bw_tb * TB,
                   datasheet_bf16_flops=bf16_tf * TB, datasheet_fp8_flops=fp8_tf * TB,
                   bandwidth=bw, bf16_flops=bf16, fp8_flops=fp8_tf * TB * (bf16 / (bf16_tf * TB)),
                   nvlink_bandwidth=nvlink_gb * GB, pcie_bandwidth=pcie_gb * GB,
                   estimated=bw_meas is None or bf16_meas is None)


#: name -> spec. SXM parts; NVLink figure is per direction (H100/H200: 900 GB/s bidirectional).
GPUS: dict[str, GpuSpec] = {
    "h200": _spec("h200", 141, 4.8, 989, 1979, 450, 64, bw_meas=4.28, bf16_meas=790),
    "h100": _spec("h100", 80, 3.35, 989, 1979, 450, 64),
    "a100": _spec("a100", 80, 2.039, 312, 0, 300, 32),
}


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


#: fixed latency of one collective / one send-recv (kernel launch + sync), seconds.
NVLINK_LATENCY_S = 8e-6
PCIE_LATENCY_S = 15e-6


def link(gpu: GpuSpec, interconnect: str) -> tuple[float, float]:
    """(bandwidth bytes/s per direction, latency s) of 'nvlink' or 'pcie' on `gpu`."""
    if interconnect == "nvlink":
        if not gpu.nvlink_bandwidth:
            raise ValueError(f"{gpu.name} has no NVLink")
        return gpu.nvlink_bandwidth, NVLINK_LATENCY_S
    if interconnect == "pcie":
        return gpu.pcie_bandwidth, PCIE_LATENCY_S
    raise ValueError(f"unknown interconnect {interconnect!r} (nvlink | pcie)")


def allreduce_time(nbytes: float, num_gpus: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce: each GPU sends and receives 2(n-1)/n of the buffer."""
    if num_gpus <= 1:
        return 0.0
    return latency + 2.0 * (num_gpus - 1) / num_gpus * nbytes / bandwidth


def send_recv_time(nbytes: float, bandwidth: float, latency: float) -> float:
    return latency + nbytes / bandwidth
