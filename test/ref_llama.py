"""test/ref_llama.py - an independent float64 numpy reference of the Llama model wlbtrain trains.

Written from the formulas (Hugging Face Llama conventions), with a hand-written backward pass; no
autograd library. Used by test/test_ref_llama.py (self-tests: finite differences, two RoPE paths,
stories260K) and test/test_model_ref.py (against the C program's dump_model tool).

Contents
  load_safetensors / save_safetensors   the safetensors file format, parsed and written by hand
  cfg_from_metadata / cfg_to_metadata   model configuration <-> safetensors metadata strings
  forward_backward / forward_loss       loss (and gradients of every weight) of a packed batch
  forward_logits / greedy_generate      logits; argmax decoding from one start token
  load_llama2c / save_llama2c           karpathy/llama2.c checkpoint format (legacy version 0)
  forward_loss_llama2c / greedy_generate_llama2c
                                        an independent token-by-token path with llama2.c's
                                        interleaved RoPE (pairs x[2i], x[2i+1])
  llama2c_to_hf                         llama2.c weights -> HF names, with HF's q/k row permutation

Model over N tokens (all micro-batches of a step concatenated; documents never attend across each
other; D = d_model / n_heads; G = n_heads / n_kv_heads query heads share one kv head):
  h = E[tokens]
  per layer:  a = rmsnorm(h, w_in)
              q = a Wq^T, k = a Wk^T, v = a Wv^T            (heads: [N, H, D], [N, Hkv, D])
              q, k = rope(q), rope(k)                       (at each token's position)
              S[j,i,t] = q[i,j] . k[t, j//G] / sqrt(D)      allowed iff doc[t]==doc[i] and t<=i
              P = softmax_t(S); O[i,j] = sum_t P[j,i,t] v[t, j//G]
              h = h + concat_j(O) Wo^T
              b = rmsnorm(h, w_post)
              h = h + (silu(b Wg^T) * (b Wu^T)) Wd^T
  z = rmsnorm(h, w_norm) Wout^T                              (Wout = E when tie_embeddings)
  loss = sum_{i: targets[i] >= 0} (logsumexp(z_i) - z_i[targets[i]]) / #{i: targets[i] >= 0}
  rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w;  silu(x) = x * sigmoid(x)
"""
import json
import math
import struct

import numpy as np

# ----------------------------------------------------------------------------------------------
# safetensors: u64 little-endian header length N, N bytes of JSON, then the raw data. The JSON maps
# each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte
# after the header) and optionally "__metadata__" to a {str: str} dict.

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U8": "u1", "BOOL": "?"}


def load_safetensors(path):
    """(tensors: {name: np.ndarray}, metadata: {str: str}) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("%s: header length %d runs past the end of the file" % (path, n))
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        if not 0 <= begin <= end <= len(data):
            raise ValueError("%s: %s: data_offsets %r outside the data" % (path, name, (begin, end)))
        raw = data[begin:end]
        if info["dtype"] == "BF16":  # bfloat16: the high half of a float32
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif info["dtype"] in _DTYPES:
            dt = np.dtype(_DTYPES[info["dtype"]])
            if len(raw) % dt.itemsize:
                raise ValueError("%s: %s: %d bytes is not a whole number of %s" % (path, name, len(raw), info["dtype"]))
            arr = np.frombuffer(raw, dtype=dt)
        else:
            raise ValueError("%s: %s: unsupported dtype %s" % (path, name, info["dtype"]))
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError("%s: %s: %d elements for shape %r" % (path, name, arr.size, shape))
        tensors[name] = arr.reshape(shape).copy()
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: array} (float64/float32/int32/int64 kept as is) and {str: str} metadata."""
    names = sorted(tensors)
    header, chunks, offset = {}, [], 0
    codes = {np.dtype(v): k for k, v in _DTYPES.items()}
    for name in names:
        arr = np.ascontiguousarray(tensors[name])
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        if dt not in codes:
            raise ValueError("%s: unsupported dtype %s" % (name, arr.dtype))
        raw = arr.astype(dt).tobytes()
        header[name] = {"dtype": codes[dt], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 8)  # pad so the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for c in chunks:
            f.write(c)


# ----------------------------------------------------------------------------------------------
# Configuration. A cfg is a dict with these keys (the same names as the dump's metadata).

CFG_TYPES = {
    "n_layers": int, "d_model": int, "n_heads": int, "n_kv_heads": int, "d_ffn": int,
    "vocab_size": int, "rope_theta": float, "norm_eps": float, "tie_embeddings": bool,
    "rope_scaling": str, "rope_scaling_factor": float, "rope_low_freq_factor": float,
    "rope_high_freq_factor": float, "rope_original_max_seq_len": int,
}
CFG_DEFAULTS = {"rope_scaling": "none", "rope_scaling_factor": 1.0, "rope_low_freq_factor": 1.0,
                "rope_high_freq_factor": 4.0, "rope_original_max_seq_len": 8192}


def _parse_bool(s):
    t = str(s).strip().lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    raise ValueError("not a boolean: %r" % s)


def cfg_from_metadata(meta):
    """cfg dict from safetensors metadata strings; unknown keys are ignored."""
    cfg = {}
    for key, typ in CFG_TYPES.items():
        if key not in meta:
            if key in CFG_DEFAULTS:
                cfg[key] = CFG_DEFAULTS[key]
                continue
            raise KeyError("metadata lacks %s" % key)
        s = meta[key]
        cfg[key] = _parse_bool(s) if typ is bool else int(float(s)) if typ is int else typ(s)
    return cfg


def cfg_to_metadata(cfg):
    return {k: (("true" if cfg[k] else "false") if CFG_TYPES[k] is bool else repr(cfg[k]) if CFG_TYPES[k] is float
                else str(cfg[k])) for k in CFG_TYPES}


def make_cfg(**kw):
    cfg = dict(CFG_DEFAULTS)
    cfg.update(rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)
    cfg.update(kw)
    missing = [k for k in CFG_TYPES if k not in cfg]
    if missing:
        raise KeyError("cfg lacks %s" % ", ".join(missing))
    return cfg


def head_dim(cfg):
    assert cfg["d_model"] % cfg["n_heads"] == 0 and cfg["n_heads"] % cfg["n_kv_heads"] == 0
    return cfg["d_model"] // cfg["n_heads"]


def weight_names(cfg):
    """The HF names of every weight of the model, in a fixed order."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["n_layers"]):
        p = "model.layers.%d." % i
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
                  p + "post_attention_layernorm.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not cfg["tie_embeddings"]:
        names.append("lm_head.weight")
    return names


def weight_shapes(cfg):
    d, F, V = cfg["d_model"], cfg["d_ffn"], cfg["vocab_size"]
    D = head_dim(cfg)
    qd, kvd = cfg["n_heads"] * D, cfg["n_kv_heads"] * D
    by_suffix = {"embed_tokens.weight": (V, d), "layernorm.weight": (d,), "q_proj.weight": (qd, d),
                 "k_proj.weight": (kvd, d), "v_proj.weight": (kvd, d), "o_proj.weight": (d, qd),
                 "gate_proj.weight": (F, d), "up_proj.weight": (F, d), "down_proj.weight": (d, F),
                 "model.norm.weight": (d,), "lm_head.weight": (V, d)}
    out = {}
    for n in weight_names(cfg):
        out[n] = next(s for suf, s in by_suffix.items() if n.endswith(suf))
    return out


def random_weights(cfg, rng, scale=1.0):
    """Random float64 weights of a sensible size (unit embeddings, 1/sqrt(fan_in) matrices)."""
    w = {}
    for n, shape in weight_shapes(cfg).items():
        if len(shape) == 1:
            w[n] = 1.0 + 0.2 * rng.standard_normal(shape)
        elif n == "model.embed_tokens.weight":
            w[n] = rng.standard_normal(shape)
        else:
            w[n] = scale * rng.standard_normal(shape) / math.sqrt(shape[1])
    return w


# ----------------------------------------------------------------------------------------------
# RoPE (HF rotate_half form).

def rope_inv_freq(cfg):
    """inv_freq[k] = 1 / theta^(2k/D), k < D/2; with rope_scaling "llama3" transformers'
    _compute_llama3_parameters rule (long wavelengths divided by factor, medium ones interpolated)."""
    D = head_dim(cfg)
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if cfg["rope_scaling"] == "none":
        return inv
    if cfg["rope_scaling"] != "llama3":
        raise ValueError("unknown rope_scaling %r" % cfg["rope_scaling"])
    factor, lo, hi = cfg["rope_scaling_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"]
    old = float(cfg["rope_original_max_seq_len"])
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old / lo, old / hi
    inv_l = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return np.where(medium, smoothed, inv_l)


def rope_cos_sin(cfg, positions):
    """cos, sin of shape [N, 1, D]: angle[p, k] = pos_p * inv[k], duplicated over both halves."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def rotate_half(x):
    """concat(-x[D/2:], x[:D/2]) on the last axis. Its transpose is -rotate_half."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope_apply(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def rope_backward(dy, cos, sin):
    # y = x*cos + R x*sin with R^T = -R  =>  dx = dy*cos - R(dy*sin)
    return dy * cos - rotate_half(dy * sin)


# ----------------------------------------------------------------------------------------------
# Building blocks with their backward passes.

def rmsnorm(x, w, eps):
    """y = x * r * w, r = 1/sqrt(mean(x^2) + eps); returns y and (xhat = x*r, r) for the backward."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    return xhat * w, (xhat, r)


def rmsnorm_backward(dy, w, cache):
    """dw = sum_i dy*xhat; dx = r * (g - xhat * mean(g*xhat)), g = dy*w (from dr/dx = -r^3 x / d)."""
    xhat, r = cache
    dw = np.sum(dy * xhat, axis=0)
    g = dy * w
    dx = r * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, dw


def attention_mask(doc):
    """allowed[i, t] = doc[t] == doc[i] and t <= i (indices in the concatenated order)."""
    doc = np.asarray(doc)
    n = len(doc)
    return (doc[None, :] == doc[:, None]) & (np.arange(n)[None, :] <= np.arange(n)[:, None])


def attention(q, k, v, mask):
    """q [N,H,D], k and v [N,Hkv,D] (already expanded to H heads by the caller: [N,H,D]).
    Returns O [N,H,D] and P [H,N,N]."""
    D = q.shape[-1]
    s = np.einsum("ihd,thd->hit", q, k) / math.sqrt(D)
    s = np.where(mask[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hit,thd->ihd", p, v), p


def attention_backward(do, q, k, v, p):
    """Gradients of O = softmax(q k^T / sqrt(D)) v w.r.t. q, k, v (all [N,H,D]; P [H,N,N]).
    dP = dO v^T; dS = P * (dP - sum_t P dP); dq = dS k / sqrt(D); dk = dS^T q / sqrt(D); dv = P^T dO."""
    D = q.shape[-1]
    dv = np.einsum("hit,ihd->thd", p, do)
    dp = np.einsum("ihd,thd->hit", do, v)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    dq = np.einsum("hit,thd->ihd", ds, k) / math.sqrt(D)
    dk = np.einsum("hit,ihd->thd", ds, q) / math.sqrt(D)
    return dq, dk, dv


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1/(1+exp(-x)), without overflow


def _f64(weights):
    return {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}


def _out_proj(cfg, W):
    if cfg["tie_embeddings"]:
        return W["model.embed_tokens.weight"]
    return W["lm_head.weight"]


# ----------------------------------------------------------------------------------------------
# Forward and backward of the whole model.

def _forward(cfg, W, tokens, positions, doc, keep):
    """Logits [N, V] and, when keep, the per-layer activations the backward needs."""
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    D, G, eps = head_dim(cfg), cfg["n_heads"] // cfg["n_kv_heads"], cfg["norm_eps"]
    tokens = np.asarray(tokens, dtype=np.int64)
    N = len(tokens)
    cos, sin = rope_cos_sin(cfg, positions)
    mask = attention_mask(doc)
    h = W["model.embed_tokens.weight"][tokens]
    caches = []
    for li in range(cfg["n_layers"]):
        p = "model.layers.%d." % li
        a, c_in = rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        q = (a @ W[p + "self_attn.q_proj.weight"].T).reshape(N, H, D)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).reshape(N, Hkv, D)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).reshape(N, Hkv, D)
        qr, kr = rope_apply(q, cos, sin), rope_apply(k, cos, sin)
        ke, ve = np.repeat(kr, G, axis=1), np.repeat(v, G, axis=1)  # head j uses kv head j // G
        o, P = attention(qr, ke, ve, mask)
        oc = o.reshape(N, H * D)
        h1 = h + oc @ W[p + "self_attn.o_proj.weight"].T
        b, c_post = rmsnorm(h1, W[p + "post_attention_layernorm.weight"], eps)
        g = b @ W[p + "mlp.gate_proj.weight"].T
        u = b @ W[p + "mlp.up_proj.weight"].T
        sg = sigmoid(g)
        act = g * sg * u
        h2 = h1 + act @ W[p + "mlp.down_proj.weight"].T
        if keep:
            caches.append(dict(a=a, c_in=c_in, qr=qr, ke=ke, ve=ve, P=P, oc=oc, b=b, c_post=c_post,
                               g=g, u=u, sg=sg, act=act))
        h = h2
    f, c_fin = rmsnorm(h, W["model.norm.weight"], eps)
    z = f @ _out_proj(cfg, W).T
    return z, (caches, f, c_fin, cos, sin)


def _cross_entropy(z, targets):
    """Mean cross-entropy over labelled tokens and dL/dz (zero rows where targets < 0)."""
    targets = np.asarray(targets, dtype=np.int64)
    lab = targets >= 0
    n = int(lab.sum())
    zmax = z.max(axis=-1, keepdims=True)
    e = np.exp(z - zmax)
    se = e.sum(axis=-1, keepdims=True)
    lse = (np.log(se) + zmax)[:, 0]
    rows = np.nonzero(lab)[0]
    if n == 0:
        return 0.0, np.zeros_like(z)
    loss = float(np.sum(lse[rows] - z[rows, targets[rows]]) / n)
    dz = e / se
    dz[rows, targets[rows]] -= 1.0
    dz[~lab] = 0.0
    return loss, dz / n


def forward_logits(cfg, weights, tokens, positions, doc):
    return _forward(cfg, _f64(weights), tokens, positions, doc, keep=False)[0]


def forward_loss(cfg, weights, tokens, targets, positions, doc):
    z = forward_logits(cfg, weights, tokens, positions, doc)
    return _cross_entropy(z, targets)[0]


def forward_backward(cfg, weights, tokens, targets, positions, doc):
    """(loss, grads): grads has the same HF names as weights, float64."""
    W = _f64(weights)
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    D, G = head_dim(cfg), cfg["n_heads"] // cfg["n_kv_heads"]
    tokens = np.asarray(tokens, dtype=np.int64)
    N = len(tokens)
    z, (caches, f, c_fin, cos, sin) = _forward(cfg, W, tokens, positions, doc, keep=True)
    loss, dz = _cross_entropy(z, targets)
    grads = {}
    # z = f Wout^T
    Wout = _out_proj(cfg, W)
    d_out = dz.T @ f
    dh, grads["model.norm.weight"] = rmsnorm_backward(dz @ Wout, W["model.norm.weight"], c_fin)
    for li in reversed(range(cfg["n_layers"])):
        p = "model.layers.%d." % li
        c = caches[li]
        # h2 = h1 + act Wd^T, act = silu(g) * u, g = b Wg^T, u = b Wu^T
        dm = dh
        grads[p + "mlp.down_proj.weight"] = dm.T @ c["act"]
        dact = dm @ W[p + "mlp.down_proj.weight"]
        g, sg = c["g"], c["sg"]
        du = dact * g * sg
        dg = dact * c["u"] * sg * (1.0 + g * (1.0 - sg))  # silu'(g) = s + g s (1 - s)
        grads[p + "mlp.gate_proj.weight"] = dg.T @ c["b"]
        grads[p + "mlp.up_proj.weight"] = du.T @ c["b"]
        db = dg @ W[p + "mlp.gate_proj.weight"] + du @ W[p + "mlp.up_proj.weight"]
        dx, grads[p + "post_attention_layernorm.weight"] = rmsnorm_backward(
            db, W[p + "post_attention_layernorm.weight"], c["c_post"])
        dh1 = dh + dx
        # h1 = h + oc Wo^T
        grads[p + "self_attn.o_proj.weight"] = dh1.T @ c["oc"]
        do = (dh1 @ W[p + "self_attn.o_proj.weight"]).reshape(N, H, D)
        dqr, dke, dve = attention_backward(do, c["qr"], c["ke"], c["ve"], c["P"])
        # expanded kv heads j = g*G + r all came from kv head g: sum their gradients
        dkr = dke.reshape(N, Hkv, G, D).sum(axis=2)
        dv = dve.reshape(N, Hkv, G, D).sum(axis=2)
        dq = rope_backward(dqr, cos, sin).reshape(N, H * D)
        dk = rope_backward(dkr, cos, sin).reshape(N, Hkv * D)
        dv = dv.reshape(N, Hkv * D)
        a = c["a"]
        grads[p + "self_attn.q_proj.weight"] = dq.T @ a
        grads[p + "self_attn.k_proj.weight"] = dk.T @ a
        grads[p + "self_attn.v_proj.weight"] = dv.T @ a
        da = (dq @ W[p + "self_attn.q_proj.weight"] + dk @ W[p + "self_attn.k_proj.weight"]
              + dv @ W[p + "self_attn.v_proj.weight"])
        dx, grads[p + "input_layernorm.weight"] = rmsnorm_backward(da, W[p + "input_layernorm.weight"], c["c_in"])
        dh = dh1 + dx
    # h = E[tokens]: scatter-add the rows; a tied E also collects the output projection's gradient
    dE = np.zeros_like(W["model.embed_tokens.weight"])
    np.add.at(dE, tokens, dh)
    if cfg["tie_embeddings"]:
        dE += d_out
    else:
        grads["lm_head.weight"] = d_out
    grads["model.embed_tokens.weight"] = dE
    return loss, grads


def greedy_generate(cfg, weights, start_token, n):
    """n tokens: start_token, then argmax of the logits at the last position, one document at
    positions 0..len-1 (full recompute each step)."""
    W = _f64(weights)
    seq = [int(start_token)]
    while len(seq) < n:
        m = len(seq)
        z = _forward(cfg, W, seq, np.arange(m), np.zeros(m, dtype=np.int64), keep=False)[0]
        seq.append(int(np.argmax(z[-1])))
    return seq


# ----------------------------------------------------------------------------------------------
# llama2.c checkpoints (karpathy/llama2.c, legacy version 0 written by export.py / model.py):
# 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative
# vocab_size means an unshared classifier follows), then float32 arrays:
#   token_embedding [V,dim], rms_att [L,dim], wq [L,dim,dim], wk [L,kv_dim,dim], wv [L,kv_dim,dim],
#   wo [L,dim,dim], rms_ffn [L,dim], w1 [L,hidden,dim], w2 [L,dim,hidden], w3 [L,hidden,dim],
#   rms_final [dim], freq_cis_real [seq_len,D/2], freq_cis_imag [seq_len,D/2], (wcls [V,dim])
# Every matrix is [out, in] row-major (run.c's matmul: xout[i] = sum_j w[i*n + j] x[j]).
# run.c fixes rope theta 10000 and rmsnorm eps 1e-5.

_L2C_ORDER = ["token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3",
              "rms_final", "freq_cis_real", "freq_cis_imag"]


def _llama2c_shapes(dim, hidden, L, H, Hkv, V, S):
    D = dim // H
    kv = Hkv * D
    return {"token_embedding": (V, dim), "rms_att": (L, dim), "wq": (L, dim, dim), "wk": (L, kv, dim),
            "wv": (L, kv, dim), "wo": (L, dim, dim), "rms_ffn": (L, dim), "w1": (L, hidden, dim),
            "w2": (L, dim, hidden), "w3": (L, hidden, dim), "rms_final": (dim,),
            "freq_cis_real": (S, D // 2), "freq_cis_imag": (S, D // 2), "wcls": (V, dim)}


def load_llama2c(path):
    """(cfg, weights): cfg in this module's keys plus max_seq_len; weights float64 under the llama2.c
    names above (wcls only when unshared)."""
    with open(path, "rb") as f:
        blob = f.read()
    dim, hidden, L, H, Hkv, Vs, S = struct.unpack("<7i", blob[:28])
    shared = Vs > 0
    V = abs(Vs)
    if min(dim, hidden, L, H, Hkv, V, S) <= 0 or dim % H or H % Hkv:
        raise ValueError("%s: implausible llama2.c header %r" % (path, (dim, hidden, L, H, Hkv, Vs, S)))
    shapes = _llama2c_shapes(dim, hidden, L, H, Hkv, V, S)
    order = _L2C_ORDER + ([] if shared else ["wcls"])
    total = sum(int(np.prod(shapes[k])) for k in order)
    floats = np.frombuffer(blob, dtype="<f4", offset=28)
    if floats.size != total:
        raise ValueError("%s: %d floats after the header, the layout needs %d" % (path, floats.size, total))
    weights, off = {}, 0
    for k in order:
        n = int(np.prod(shapes[k]))
        weights[k] = floats[off:off + n].astype(np.float64).reshape(shapes[k])
        off += n
    cfg = make_cfg(n_layers=L, d_model=dim, n_heads=H, n_kv_heads=Hkv, d_ffn=hidden, vocab_size=V,
                   rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=shared)
    cfg["max_seq_len"] = S
    return cfg, weights


def save_llama2c(path, cfg, weights):
    """Writes weights (llama2.c names) as a llama2.c checkpoint (the inverse of load_llama2c)."""
    S = weights["freq_cis_real"].shape[0]
    V = cfg["vocab_size"]
    hdr = struct.pack("<7i", cfg["d_model"], cfg["d_ffn"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
                      V if cfg["tie_embeddings"] else -V, S)
    order = _L2C_ORDER + ([] if cfg["tie_embeddings"] else ["wcls"])
    with open(path, "wb") as f:
        f.write(hdr)
        for k in order:
            f.write(np.ascontiguousarray(weights[k], dtype="<f4").tobytes())


def llama2c_freq(cfg):
    """llama2.c's rotation frequency of pair i (elements 2i, 2i+1) of a head: 1 / 10000^(2i/D)."""
    D = head_dim(cfg)
    return 1.0 / 10000.0 ** (np.arange(0, D, 2, dtype=np.float64) / D)


def _hf_permute(w, n_heads):
    """HF convert_llama_weights_to_hf.py: rows of each head reordered from interleaved pairs
    (2i, 2i+1) to halves (i, i + D/2): w.view(H, D/2, 2, d).transpose(1, 2).reshape(H*D, d)."""
    rows, d = w.shape
    D = rows // n_heads
    return w.reshape(n_heads, D // 2, 2, d).transpose(0, 2, 1, 3).reshape(rows, d)


def llama2c_to_hf(weights, cfg):
    """The llama2.c weights under HF names, wq and wk rows permuted for rotate_half RoPE."""
    out = {"model.embed_tokens.weight": weights["token_embedding"].copy(),
           "model.norm.weight": weights["rms_final"].copy()}
    for i in range(cfg["n_layers"]):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = weights["rms_att"][i].copy()
        out[p + "self_attn.q_proj.weight"] = _hf_permute(weights["wq"][i], cfg["n_heads"])
        out[p + "self_attn.k_proj.weight"] = _hf_permute(weights["wk"][i], cfg["n_kv_heads"])
        out[p + "self_attn.v_proj.weight"] = weights["wv"][i].copy()
        out[p + "self_attn.o_proj.weight"] = weights["wo"][i].copy()
        out[p + "post_attention_layernorm.weight"] = weights["rms_ffn"][i].copy()
        out[p + "mlp.gate_proj.weight"] = weights["w1"][i].copy()
        out[p + "mlp.up_proj.weight"] = weights["w3"][i].copy()
        out[p + "mlp.down_proj.weight"] = weights["w2"][i].copy()
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = weights["wcls"].copy()
    return out


class Llama2cRunner:
    """Token-by-token forward with a key/value cache, as llama2.c's run.c computes it (one
    document, position = index), but in float64 and vectorized over heads. RoPE rotates the
    interleaved pairs (x[2i], x[2i+1]) of each head by pos * llama2c_freq[i]."""

    def __init__(self, cfg, weights):
        self.cfg, self.w = cfg, _f64(weights)
        self.D = head_dim(cfg)
        self.freq = llama2c_freq(cfg)
        self.kcache = [[] for _ in range(cfg["n_layers"])]
        self.vcache = [[] for _ in range(cfg["n_layers"])]
        self.pos = 0

    def _rmsnorm(self, x, w):
        return w * (x / math.sqrt(np.dot(x, x) / x.size + self.cfg["norm_eps"]))

    def _rope(self, x, pos):
        # x [heads, D]: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos) on each pair
        ang = pos * self.freq
        c, s = np.cos(ang), np.sin(ang)
        x0, x1 = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2] = x0 * c - x1 * s
        out[:, 1::2] = x0 * s + x1 * c
        return out

    def step(self, token):
        """Logits [V] of the next token after `token` at the current position."""
        cfg, w, D = self.cfg, self.w, self.D
        H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
        G = H // Hkv
        pos = self.pos
        x = w["token_embedding"][token].copy()
        for l in range(cfg["n_layers"]):
            xb = self._rmsnorm(x, w["rms_att"][l])
            q = self._rope((w["wq"][l] @ xb).reshape(H, D), pos)
            k = self._rope((w["wk"][l] @ xb).reshape(Hkv, D), pos)
            v = (w["wv"][l] @ xb).reshape(Hkv, D)
            self.kcache[l].append(k)
            self.vcache[l].append(v)
            K = np.stack(self.kcache[l])  # [pos+1, Hkv, D]
            Vv = np.stack(self.vcache[l])
            att = np.empty((H, D))
            for h in range(H):
                sc = K[:, h // G, :] @ q[h] / math.sqrt(D)
                e = np.exp(sc - sc.max())
                att[h] = (e / e.sum()) @ Vv[:, h // G, :]
            x = x + w["wo"][l] @ att.reshape(H * D)
            xb = self._rmsnorm(x, w["rms_ffn"][l])
            h1, h3 = w["w1"][l] @ xb, w["w3"][l] @ xb
            x = x + w["w2"][l] @ (h1 / (1.0 + np.exp(-h1)) * h3)
        x = self._rmsnorm(x, w["rms_final"])
        self.pos += 1
        return (w["token_embedding"] if cfg["tie_embeddings"] else w["wcls"]) @ x


def llama2c_logits(cfg, weights, tokens):
    r = Llama2cRunner(cfg, weights)
    return np.stack([r.step(int(t)) for t in tokens])


def forward_loss_llama2c(cfg, weights, tokens, targets=None):
    """Mean cross-entropy of a single document at positions 0..N-1 on the llama2.c path; targets
    default to the next token (the last token has none)."""
    tokens = [int(t) for t in tokens]
    if targets is None:
        targets = tokens[1:] + [-1]
    return _cross_entropy(llama2c_logits(cfg, weights, tokens), targets)[0]


def greedy_generate_llama2c(cfg, weights, start_token, n, return_logits=False):
    """n tokens from start_token by argmax on the llama2.c path (and the logits of each step)."""
    r = Llama2cRunner(cfg, weights)
    seq, logits = [int(start_token)], []
    while len(seq) < n:
        z = r.step(seq[-1])
        logits.append(z)
        seq.append(int(np.argmax(z)))
    return (seq, logits) if return_logits else seq
