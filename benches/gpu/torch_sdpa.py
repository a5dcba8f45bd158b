"""PyTorch's causal attention on the same shapes as dayone's `bench_flash_attention`
(kernels-cuda/tests/cuda_flash.rs): one sequence of N tokens, 32 heads, bf16, hd_k/hd_v 192/128
(expanded MLA; SDPA's flash backend needs equal dims, so the memory-efficient backend runs) and
128/128 (flash backend). Also the card's ceilings in the same call: dense bf16 GEMM TFLOP/s and
device copy GB/s (1 GiB read + 1 GiB write). Prints one line per figure."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

def timed(f, iters):
    f()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        f()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ms = timed(lambda: x @ x, 20)
print(f"ceiling: bf16 GEMM 8192^3 {2 * 8192**3 / ms / 1e9:.1f} TFLOP/s")
src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
ms = timed(lambda: dst.copy_(src), 20)
print(f"ceiling: device copy 1 GiB {2 * (1 << 30) / ms / 1e6:.0f} GB/s")
del x, src, dst

h = 32
for dk, dv in [(192, 128), (128, 128)]:
    for n in [8192, 32768, 131072]:
        q = torch.rand(1, h, n, dk, device="cuda", dtype=torch.bfloat16) * 2 - 1
        k = torch.rand(1, h, n, dk, device="cuda", dtype=torch.bfloat16) * 2 - 1
        v = torch.rand(1, h, n, dv, device="cuda", dtype=torch.bfloat16) * 2 - 1
        backends = [SDPBackend.FLASH_ATTENTION] if dk == dv else []
        backends.append(SDPBackend.EFFICIENT_ATTENTION)
        for be in backends:
            try:
                with sdpa_kernel([be]):
                    ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3 if n > 65536 else 10)
                flops = 2 * h * (dk + dv) * n * (n + 1) / 2
                print(f"torch sdpa {be.name} bf16 causal N {n} H {h} hd_k {dk} hd_v {dv}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")
            except Exception as e:
                print(f"torch sdpa {be.name} N {n} hd {dk}/{dv}: failed: {str(e)[:120]}")
        del q, k, v
        torch.cuda.empty_cache()
