#!/usr/bin/env python3
"""bench/torch_llama.py - the PyTorch side of bench/gpu_throughput.sh: the same Llama model in PyTorch
on the same GPU, for tokens/s and MFU beside wlbtrain's.

Model: Hugging Face Llama conventions (RMSNorm, RoPE with Llama 3.1 scaling, grouped-query
attention, SwiGLU, tied or untied output), fp32 weights and AdamW (PyTorch's, fused), the forward
and backward under torch.autocast(bfloat16) - as wlbtrain keeps fp32 master weights and multiplies
in bf16. The loss is computed in chunks of rows under activation checkpointing so that the
[tokens, vocabulary] logits never exist whole (wlbtrain does the same). Attention, --attention:
  flex  FlexAttention (torch.nn.attention.flex_attention, compiled) over a document-causal block
        mask made by create_block_mask from the document ids - no dense mask anywhere - with every
        transformer layer compiled by torch.compile (--compile, the default with flex): the strong
        baseline a user would pick today;
  sdpa  scaled_dot_product_attention with a dense document-causal boolean mask (the memory-efficient
        kernel; the dense mask does not fit at 32K windows), uncompiled: the plain baseline.

Batches: the documents of a Megatron data set (bench/make_corpus.py) in file order, cut into
windows of --ctx tokens (documents split at window ends, positions restarting in each piece); a
step is --micro windows. Prints one JSON line: tokens/s (median over the timed steps), step ms,
peak memory in GB of 10^9 bytes (the device's memory in use at the peak, as wlbtrain counts its own:
the CUDA context and torch.cuda.max_memory_reserved; the tensors' alone beside it), and the FLOPs
per step counted as in bench/gpu_throughput.sh (6 N per token for the weights,
attention 12 L H D per pair of tokens of one document that attend, causal pairs only).
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

PRESETS = {
    "llama3.2-1b": dict(n_layers=16, d=2048, heads=32, kv=8, ffn=8192, vocab=128256, theta=500000.0, eps=1e-5,
                        tied=True, scaling=dict(factor=32.0, low=1.0, high=4.0, orig=8192)),
    "llama3.1-8b": dict(n_layers=32, d=4096, heads=32, kv=8, ffn=14336, vocab=128256, theta=500000.0, eps=1e-5,
                        tied=False, scaling=dict(factor=8.0, low=1.0, high=4.0, orig=8192)),
    "tiny": dict(n_layers=4, d=128, heads=4, kv=2, ffn=384, vocab=512, theta=10000.0, eps=1e-5, tied=False,
                 scaling=None),
}


def inv_freq(c):
    D = c["d"] // c["heads"]
    f = 1.0 / c["theta"] ** (np.arange(0, D, 2) / D)
    s = c["scaling"]
    if s:
        wl = 2 * math.pi / f
        low, high = s["orig"] / s["low"], s["orig"] / s["high"]
        smooth = (s["orig"] / wl - s["low"]) / (s["high"] - s["low"])
        f = np.where(wl > low, f / s["factor"], np.where(wl < high, f, (1 - smooth) * f / s["factor"] + smooth * f))
    return torch.tensor(f, dtype=torch.float32)


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, D = c["d"], c["d"] // c["heads"]
        self.embed = torch.nn.Embedding(c["vocab"], d)
        self.layers = torch.nn.ModuleList()
        for _ in range(c["n_layers"]):
            m = torch.nn.Module()
            m.n1 = torch.nn.Parameter(torch.ones(d))
            m.q = torch.nn.Linear(d, c["heads"] * D, bias=False)
            m.k = torch.nn.Linear(d, c["kv"] * D, bias=False)
            m.v = torch.nn.Linear(d, c["kv"] * D, bias=False)
            m.o = torch.nn.Linear(c["heads"] * D, d, bias=False)
            m.n2 = torch.nn.Parameter(torch.ones(d))
            m.g = torch.nn.Linear(d, c["ffn"], bias=False)
            m.u = torch.nn.Linear(d, c["ffn"], bias=False)
            m.dn = torch.nn.Linear(c["ffn"], d, bias=False)
            self.layers.append(m)
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.head = None if c["tied"] else torch.nn.Linear(d, c["vocab"], bias=False)
        self.register_buffer("inv_freq", inv_freq(c), persistent=False)
        self.flex = None
        self.layer_fn = self.layer
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def rms(self, x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.c["eps"]).to(x.dtype) * w

    def rope(self, x, pos):
        ang = pos[:, None].float() * self.inv_freq[None, :]
        cos, sin = torch.cos(ang).to(x.dtype)[None, :, None, :], torch.sin(ang).to(x.dtype)[None, :, None, :]
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def layer(self, m, h, pos, mask):
        """One transformer layer; mask is a dense boolean mask (sdpa) or a FlexAttention BlockMask."""
        c = self.c
        D = c["d"] // c["heads"]
        S = h.shape[1]
        a = self.rms(h, m.n1)
        q = self.rope(m.q(a).view(1, S, c["heads"], D), pos).transpose(1, 2)
        k = self.rope(m.k(a).view(1, S, c["kv"], D), pos).transpose(1, 2)
        v = m.v(a).view(1, S, c["kv"], D).transpose(1, 2)
        if self.flex is not None:
            att = self.flex(q, k, v, block_mask=mask, enable_gqa=True)
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        h = h + m.o(att.transpose(1, 2).reshape(1, S, c["heads"] * D))
        b = self.rms(h, m.n2)
        return h + m.dn(F.silu(m.g(b)) * m.u(b))

    def forward(self, tokens, pos, mask):
        h = self.embed(tokens)[None]
        for m in self.layers:
            h = self.layer_fn(m, h, pos, mask)
        return self.rms(h, self.norm)[0]

    def loss(self, hn, targets, chunk=4096):
        w = self.embed.weight if self.head is None else self.head.weight

        def part(x, t):
            return F.cross_entropy((x @ w.t()).float(), t, ignore_index=-1, reduction="sum")

        total = 0
        for r in range(0, hn.shape[0], chunk):
            total = total + ckpt.checkpoint(part, hn[r:r + chunk], targets[r:r + chunk], use_reentrant=False)
        return total


def windows(prefix, ctx, device, flex):
    """Yields (tokens, targets, positions, mask, attention pairs) per window of the data set; the mask is
    a FlexAttention block mask with flex, else a dense boolean mask."""
    with open(prefix + ".idx", "rb") as f:
        raw = f.read()
    code, n = raw[17], int.from_bytes(raw[18:26], "little")
    lengths = np.frombuffer(raw[34:34 + 4 * n], dtype="<i4")
    dtype = np.int32 if code == 4 else np.uint16
    data = np.fromfile(prefix + ".bin", dtype=dtype)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    buf_tok, buf_doc, buf_pos, doc_id = [], [], [], 0
    for s, L in zip(starts, lengths):
        doc = data[s:s + L].astype(np.int64)
        off = 0
        while off < L:
            room = ctx - len(buf_tok)
            piece = doc[off:off + room]
            buf_tok.extend(piece)
            buf_doc.extend([doc_id] * len(piece))
            buf_pos.extend(range(off, off + len(piece)))
            # the target of a piece's last token is the next token of its document, if any
            off += len(piece)
            doc_id += 1
            if len(buf_tok) == ctx:
                yield pack(buf_tok, buf_doc, buf_pos, device, flex)
                buf_tok, buf_doc, buf_pos = [], [], []


def pack(tok, doc, pos, device, flex):
    tok = torch.tensor(tok, device=device)
    doc = torch.tensor(doc, device=device)
    pos = torch.tensor(pos, device=device)
    if flex:
        from torch.nn.attention.flex_attention import create_block_mask

        def document_causal(b, h, q, kv):
            return (doc[q] == doc[kv]) & (q >= kv)

        mask = create_block_mask(document_causal, B=None, H=None, Q_LEN=len(tok), KV_LEN=len(tok), device=device)
    else:
        same = doc[None, :] == doc[:, None]
        causal = torch.ones(len(tok), len(tok), dtype=torch.bool, device=device).tril()
        mask = (same & causal)[None, None]
    tgt = torch.where(torch.cat([doc[1:] == doc[:-1], torch.tensor([False], device=device)]),
                      torch.cat([tok[1:], tok[-1:]]), torch.full_like(tok, -1))
    _, counts = torch.unique_consecutive(doc, return_counts=True)
    pairs = int((counts * (counts + 1) // 2).sum())
    return tok, tgt, pos, mask, pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="llama3.2-1b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0, help="transformer layers (default: the preset's; the 8B "
                    "layer bench keeps 4 of Llama 3.1 8B's 32, so that one GPU holds them)")
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU")
    ap.add_argument("--attention", default="flex", choices=["flex", "sdpa"])
    ap.add_argument("--compile", default=None, choices=["yes", "no"],
                    help="compile every transformer layer (default: yes with flex, no with sdpa)")
    a = ap.parse_args()
    c = dict(PRESETS[a.model])
    if a.layers > 0:
        c["n_layers"] = a.layers
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    # What the device holds before the model: the CUDA context (and anything else on the GPU), which
    # wlbtrain's peak (the device's total - free) counts too.
    base = 0
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        base = total - free
    torch.manual_seed(0)
    model = Llama(c).to(dev)
    flex = a.attention == "flex"
    compiled = (a.compile or ("yes" if flex else "no")) == "yes"
    if flex:
        from torch.nn.attention.flex_attention import flex_attention
        model.flex = torch.compile(flex_attention, dynamic=False)
    if compiled:
        model.layer_fn = torch.compile(model.layer, dynamic=False)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.type == "cuda")
    it = windows(a.data, a.ctx, dev, flex)
    times, tokens, flops = [], 0, []
    D = c["d"] // c["heads"]
    for step in range(a.steps):
        batch = [next(it) for _ in range(a.micro)]
        sync()
        t0 = time.perf_counter()
        labeled = sum(int((b[1] >= 0).sum()) for b in batch)
        for tok, tgt, pos, mask, _ in batch:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                hn = model(tok, pos, mask)
                loss = model.loss(hn, tgt) / labeled
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        pairs = sum(b[4] for b in batch)
        if step >= a.warmup:
            times.append(dt)
            tokens = a.micro * a.ctx
            flops.append(6 * n_params * tokens + 12 * c["n_layers"] * c["heads"] * D * pairs)
    med = float(np.median(times))
    impl = "PyTorch %s, %s%s" % (torch.__version__, "FlexAttention (document-causal block mask)" if flex else
                                 "SDPA with a dense document mask", " + torch.compile" if compiled else "")
    print(json.dumps({"impl": impl, "model": a.model, "layers": c["n_layers"], "ctx": a.ctx, "params": n_params,
                      "tokens_per_step": tokens, "step_ms": med * 1e3, "tokens_per_s": tokens / med,
                      "flops_per_step": float(np.median(flops)),
                      # GB of 10^9 bytes, wlbtrain's unit. peak_mem_gb: the device's memory in use at the
                      # peak, as wlbtrain's mem_peak_gb counts it (the context before the model, plus the
                      # caching allocator's most reserved); peak_allocated_gb: the tensors' alone.
                      "peak_mem_gb": (base + torch.cuda.max_memory_reserved()) / 1e9 if dev.type == "cuda" else 0,
                      "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if dev.type == "cuda" else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
