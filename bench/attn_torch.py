"""bench/attn_torch.py - PyTorch's attention kernels on the document mix of a segment file, timed as
bench/attn_kernels.c times wlbtrain's: forward, and forward + backward, in TFLOP/s counted on the
causal pairs within documents (forward 4 D H per pair, backward 2.5 times the forward).

Kernels (each skipped with its reason where this PyTorch lacks it):
  flex   FlexAttention, compiled, over a document-causal block mask made by create_block_mask from
         the document ids (no dense mask), grouped-query heads native (enable_gqa)
  fa2    FlashAttention-2 varlen as PyTorch ships it: aten._flash_attention_forward over the
         cumulative document lengths (kv heads repeated to the query heads: the kernel has no GQA)
  fa3    FlashAttention-3 varlen (Hopper), flash_attn_interface.flash_attn_varlen_func, GQA native:
         only where the image has the package (else a skipped row)
  dense  SDPA, causal, one sequence as long as the window (flash or cuDNN, whichever PyTorch
         picks): the dense ceiling, its TFLOP/s counted on that sequence's own causal pairs

Usage: python3 bench/attn_torch.py SEGMENTS [--heads 32] [--kv-heads 8] [--dim 64] [--iters 10]
SEGMENTS: "q_row q_len kv_row kv_len" a line; only whole documents (q_row = kv_row, q_len = kv_len).
Prints one JSON line per kernel, the keys of attn_kernels.c.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F


def timed(fn, iters):
    """Milliseconds per call: 2 warm-up calls (compilation), then the median of `iters` timed ones."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def report(name, lens, pairs, H, D, fwd, fwdbwd, extra=None):
    f = 4.0 * D * H * pairs
    line = {"kernel": name, "rows": sum(lens), "segments": len(lens), "pairs": pairs, "fwd_ms": round(fwd, 4),
            "fwd_tflops": round(f / fwd / 1e9, 2), "fwdbwd_ms": round(fwdbwd, 4),
            "fwdbwd_tflops": round(3.5 * f / fwdbwd / 1e9, 2)}
    line.update(extra or {})
    print(json.dumps(line), flush=True)


def skipped(name, why):
    print(json.dumps({"kernel": name, "skipped": str(why).splitlines()[0][:200]}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("segments")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--kernels", default="flex,fa2,fa3,dense")
    a = ap.parse_args()
    lens = []
    for line in open(a.segments):
        if line.strip():
            qr, ql, kr, kl = map(int, line.split())
            if qr != kr or ql != kl:
                sys.exit("wlbtrain: error: attn_torch.py: only whole documents (q_row = kv_row, q_len = kv_len)")
            lens.append(ql)
    H, Hkv, D, T = a.heads, a.kv_heads, a.dim, sum(lens)
    pairs = sum(n * (n + 1) // 2 for n in lens)
    dev = "cuda"
    torch.manual_seed(0)
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(T, Hkv, D, device=dev, dtype=torch.bfloat16)
    dout = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    kernels = a.kernels.split(",")

    if "flex" in kernels:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))

            def document_causal(b, h, qi, ki):
                return (doc[qi] == doc[ki]) & (qi >= ki)

            mask = create_block_mask(document_causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=dev)
            flex = torch.compile(flex_attention, dynamic=False)
            qf, kf, vf = (x.transpose(0, 1).unsqueeze(0).detach().requires_grad_() for x in (q, k, v))
            dof = dout.transpose(0, 1).unsqueeze(0)

            def fwd():
                with torch.no_grad():
                    flex(qf, kf, vf, block_mask=mask, enable_gqa=True)

            def fwdbwd():
                flex(qf, kf, vf, block_mask=mask, enable_gqa=True).backward(dof)

            report("flex (compiled, block mask)", lens, pairs, H, D, timed(fwd, a.iters), timed(fwdbwd, a.iters))
        except Exception as e:  # noqa: BLE001 - a kernel this PyTorch lacks is reported, not fatal
            skipped("flex (compiled, block mask)", e)

    if "fa2" in kernels:
        try:
            cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=dev)
            cu[1:] = torch.cumsum(torch.tensor(lens, device=dev), 0)
            rep = H // Hkv
            qv = q.detach().requires_grad_()
            kv_ = k.repeat_interleave(rep, dim=1).detach().requires_grad_()
            vv = v.repeat_interleave(rep, dim=1).detach().requires_grad_()
            mx = max(lens)

            def call():
                return torch.ops.aten._flash_attention_forward(qv, kv_, vv, cu, cu, mx, mx, 0.0, True, False)[0]

            def fwd():
                with torch.no_grad():
                    call()

            def fwdbwd():
                call().backward(dout)

            report("FlashAttention-2 varlen (aten)", lens, pairs, H, D, timed(fwd, a.iters),
                   timed(fwdbwd, a.iters))
        except Exception as e:  # noqa: BLE001
            skipped("FlashAttention-2 varlen (aten)", e)

    if "fa3" in kernels:  # FlashAttention-3 (Hopper), where the image has its package
        try:
            import flash_attn_interface  # noqa: PLC0415 - optional: absent from most images

            cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=dev)
            cu[1:] = torch.cumsum(torch.tensor(lens, device=dev), 0)
            q3, k3, v3 = (x.detach().requires_grad_() for x in (q, k, v))
            mx = max(lens)

            def call3():
                o3 = flash_attn_interface.flash_attn_varlen_func(q3, k3, v3, cu, cu, mx, mx, causal=True)
                return o3[0] if isinstance(o3, tuple) else o3

            def fwd():
                with torch.no_grad():
                    call3()

            def fwdbwd():
                call3().backward(dout)

            report("FlashAttention-3 varlen", lens, pairs, H, D, timed(fwd, a.iters), timed(fwdbwd, a.iters))
        except Exception as e:  # noqa: BLE001
            skipped("FlashAttention-3 varlen", e)

    if "dense" in kernels:
        try:
            qd, kd, vd = (x.transpose(0, 1).unsqueeze(0).detach().requires_grad_() for x in (q, k, v))
            dod = dout.transpose(0, 1).unsqueeze(0)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)

            def fwdbwd():
                F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True).backward(dod)

            report("SDPA dense causal, one sequence", [T], T * (T + 1) // 2, H, D, timed(fwd, a.iters),
                   timed(fwdbwd, a.iters))
        except Exception as e:  # noqa: BLE001
            skipped("SDPA dense causal, one sequence", e)


if __name__ == "__main__":
    main()
