#!/usr/bin/env python3
"""Does one SDPA call over both CFG branches (batch 2) beat two calls of batch 1 at the DiT's shapes?

PyTorch's cuDNN and flash SDPA backends on the GPU, [B, L, H, D] bf16 rows viewed as [B, H, L, D] (the layout dzr
hands cuDNN), Lq 1785 queries of 40 heads x 128, keys: the self-attention's history + 1785 current rows at each window
fill, and the text cross-attention's 512. Prints milliseconds per call pair (median of 50 after 10 warm-ups).
Usage: python3 scripts/bench/sdpa_batch.py
"""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, D, LQ = 40, 128, 1785


def timed(fn, reps=50):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for lk in (512, 2665, 4425, 6185, 7945):
            q = torch.randn(2, LQ, H, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(2, lk, H, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(2, lk, H, D, device=dev, dtype=torch.bfloat16)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel([backend]):
                two = timed(lambda: [F.scaled_dot_product_attention(qt[i:i + 1], kt[i:i + 1], vt[i:i + 1])
                                     for i in range(2)])
                one = timed(lambda: F.scaled_dot_product_attention(qt, kt, vt))
            flops = 4 * 2 * LQ * lk * H * D
            print(f"{backend.name:16s} lk {lk:5d}: two calls {two:.3f} ms ({flops / two / 1e9:.0f} TFLOP/s), "
                  f"one call of batch 2 {one:.3f} ms ({flops / one / 1e9:.0f} TFLOP/s), {100 * (1 - one / two):+.1f}%")


if __name__ == "__main__":
    main()
