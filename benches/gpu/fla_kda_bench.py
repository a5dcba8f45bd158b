#!/usr/bin/env python3
"""Times fla's Triton `chunk_kda` (fla-core) at the shapes of dayone's `bench_kda_chunked`:
B 1, H 32, K = V = 128, bf16 q/k/v, T 8192 and 32768, `use_qk_l2norm_in_kernel=True`, f32 log-gate
precomputed (not timed), beta, f32 initial state, `output_final_state=True`;
`triton.testing.do_bench` (median ms). Usage: python3 benches/gpu/fla_kda_bench.py [T ...]"""
import sys

import torch
import triton
from fla.ops.kda import chunk_kda


def main():
    ts = [int(x) for x in sys.argv[1:]] or [8192, 32768]
    dev = "cuda"
    B, H, K, V = 1, 32, 128, 128
    print(f"fla chunk_kda on {torch.cuda.get_device_name()} (torch {torch.__version__}, "
          f"triton {triton.__version__})", flush=True)
    rows = []
    for T in ts:
        torch.manual_seed(0)
        q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
        # log-gate as the KDA layer computes it: -exp(A_log) * softplus(a + dt_bias), f32
        a = torch.rand(B, T, H, K, device=dev) * 2 - 1
        dt_bias = torch.rand(H, K, device=dev) - 1.0
        a_log = torch.log(1.65 + 1.35 * (torch.rand(H, device=dev) * 2 - 1))
        g = (-a_log.exp()[:, None] * torch.nn.functional.softplus(a + dt_bias)).float()
        beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(torch.bfloat16)
        h0 = torch.randn(B, H, K, V, device=dev, dtype=torch.float32) * 0.1

        def run():
            return chunk_kda(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                             output_final_state=True, use_qk_l2norm_in_kernel=True)

        run()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(run, warmup=50, rep=300)
        rows.append((T, ms))
        print(f"T {T}: fla chunk_kda {ms:.3f} ms", flush=True)
    print("| T | fla chunk_kda ms | Mtok/s |")
    print("| --- | --- | --- |")
    for T, ms in rows:
        print(f"| {T} | {ms:.3f} | {T / ms / 1e3:.1f} |")


if __name__ == "__main__":
    main()
