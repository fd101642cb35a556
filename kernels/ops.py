"""The three operator modules — attention, FFN, linear logp — as production (P) and strict (R).

Every function takes ``impl`` ("P" or "R") and a physical tensor-parallel size ``tp``; ranks are
emulated with :class:`~rlk_kernels.collectives.VirtualGroup` and talk only through
:mod:`rlk_kernels.collectives`. Module boundaries (what a case letter switches):

- attention: input RMSNorm, fused QKV projection (column-parallel), per-head q/k RMSNorm,
  rotary embedding, core attention, output projection (row-parallel);
- ffn: post-attention RMSNorm, gate/up projection (column-parallel), SwiGLU, down projection
  (row-parallel);
- logp: final RMSNorm, LM head (vocabulary-parallel) and the selected-token log-probability.

P is what frameworks do: one GEMM per rank over however many rows arrive, partial sums added in
rank order, SDPA (prefill and decode on different paths, ring merge under CP), log-softmax over
the gathered vocabulary. R fixes every order: per-virtual-shard GEMMs through
:func:`~rlk_kernels.primitives.tiled_matmul_shards`, fp32 partials reduced in one fixed tree over
the ``canonical_tp`` virtual shards, attention over global key positions in fixed KV blocks merged
in block order, and logp merged from per-shard (max, sum-exp, target logit) summaries in global
vocabulary order. The R entry points :func:`strict_linear_rows`, :func:`strict_attention`,
:func:`strict_logp` take a ``device`` (None: where the inputs are); the CPU implementation is the reference a GPU twin must match.

Example::

    >>> import torch
    >>> from rlk_kernels.model import ModelConfig, init_weights, layer_weights
    >>> cfg = ModelConfig.smoke(); w = layer_weights(init_weights(cfg, 0, layers=1), 0)
    >>> x = torch.randn(5, cfg.hidden)
    >>> a, b = ffn_module("R", w, cfg, x, tp=1), ffn_module("R", w, cfg, x, tp=8)
    >>> bool((a.view(torch.int32) == b.view(torch.int32)).all())
    True
"""

from __future__ import annotations

from rlk_kernels import primitives as pr
from rlk_kernels.collectives import all_gather, all_reduce_rank_order, group_for
from rlk_kernels.layouts import virtual_shards

ATTENTION_KV_BLOCK = 16

BACKEND_IDS = {
    ("attention", "R"): "rlkernel.strict.attention.fixed_kv_blocks.v1",
    ("ffn", "R"): "rlkernel.strict.ffn.canonical_tp.v1",
    ("logp", "R"): "rlkernel.linear_logp.bitwise.v1",
    ("attention", "P"): "torch.sdpa.prefill_decode",
    ("ffn", "P"): "torch.matmul.rank_order_allreduce",
    ("logp", "P"): "torch.logp.vocab_parallel_train.gathered_log_softmax_rollout",
}


def _check_impl(impl: str) -> None:
    if impl not in ("P", "R"):
        raise ValueError(f"implementation must be 'P' or 'R', got {impl!r}")


def _production_rms_norm(x, weight, eps):
    import torch
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _norm(impl, x, weight, eps):
    if impl == "R" and _gpu(x):
        from rlk_kernels.gpu.triton_pointwise import rms_norm
        return rms_norm(x, weight, eps)
    return pr.rms_norm(x, weight, eps) if impl == "R" else _production_rms_norm(x, weight, eps)


def _gpu(tensor) -> bool:
    """CUDA tensors take the Triton kernels of :mod:`rlk_kernels.gpu` (the CPU code is their reference)."""
    from rlk_kernels.gpu import use_gpu_path
    return use_gpu_path(tensor)


def strict_backend_id(module: str, device: str) -> str:
    """The strict backend's id; on CUDA the Triton kernels run (suffix ``+triton``)."""
    import torch
    base = BACKEND_IDS[(module, "R")]
    return base + "+triton" if device == "cuda" and _gpu(torch.empty(0, device=device)) else base


# --- strict building blocks (the GPU-twin boundary) -------------------------------------------------

def strict_linear_rows(x, w_shards, device: str | None = None):
    """Per-virtual-shard products ``x @ w_shards[s]`` -> [S, M, N], row-invariant; ``x`` [M, K] or [S, M, K]."""
    if device is not None:
        x, w_shards = x.to(device), w_shards.to(device)
    if _gpu(x):
        from rlk_kernels.gpu.triton_gemm import shard_matmul
        return shard_matmul(x, w_shards)
    return pr.tiled_matmul_shards(x, w_shards)


def strict_linear_tree(x, w_shards, device: str | None = None):
    """Row-parallel product reduced over the given (aligned, power-of-two) shards in the fixed tree: [1, M, N].

    The sub-tree of a rank's shards; :func:`strict_linear_reduce` over the ranks completes the same
    tree as over all shards at once.
    """
    if device is not None:
        x, w_shards = x.to(device), w_shards.to(device)
    if _gpu(x):
        from rlk_kernels.gpu.triton_gemm import shard_matmul_tree
        return shard_matmul_tree(x, w_shards).unsqueeze(0)
    return pr.tree_reduce(pr.tiled_matmul_shards(x, w_shards).unbind(0)).unsqueeze(0)


def strict_linear_reduce(group, partials_by_rank: dict):
    """Fixed tree over all virtual shards: each rank contributes its shards' fp32 partials [S_local, M, N]."""
    shards = [p for part in all_gather(group, partials_by_rank) for p in part.unbind(0)]
    return pr.tree_reduce(shards)


def residual_add(h, out):
    """``h + out.to(h.dtype)``: a module's output added to the residual stream. On the GPU, where a
    strict row-parallel product left fp32 and the stream is bf16, one kernel with the bits of those
    two eager ops (one pass instead of a cast and an add)."""
    import torch
    if out.dtype == torch.float32 and h.dtype in (torch.bfloat16, torch.float16) and out.shape == h.shape \
            and _gpu(h):
        from rlk_kernels.gpu.triton_gemm import tree_reduce_shards
        return tree_reduce_shards(out.unsqueeze(0), residual=h)
    return h + out.to(h.dtype)


def strict_attention(q, k, v, q_pos, *, block: int = ATTENTION_KV_BLOCK, device: str | None = None):
    """Causal attention of queries at global positions over keys in global order, in fixed KV blocks.

    ``q`` [B, Hq, Lq, D] (already scaled), ``k``/``v`` [B, Hkv, Lk, D] holding key positions 0..Lk-1,
    ``q_pos`` [B, Lq]. A query at position p attends keys 0..p; blocks are merged in block order with
    an online softmax, and a block after p leaves the state bit-for-bit untouched, so the result is
    the same in prefill, in decode with a KV cache, under any CP placement and any batch size.
    """
    import torch

    if device is not None:
        q, k, v, q_pos = q.to(device), k.to(device), v.to(device), q_pos.to(device)
    if _gpu(q):
        from rlk_kernels.gpu.triton_attention import attention
        return attention(q, k, v, q_pos)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    keys = k.shape[2]
    blocks = max(1, -(-keys // block))
    pad = blocks * block - keys
    if pad:
        k = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], dim=2)
        v = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], dim=2)
    neg_inf = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    m = l = o = None
    for b in range(blocks):
        kb = k[:, :, b * block:(b + 1) * block]
        vb = v[:, :, b * block:(b + 1) * block]
        key_pos = torch.arange(b * block, (b + 1) * block, device=q.device)
        valid = (key_pos[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)          # [B,1,Lq,BK]
        scores = pr.tree_sum(q.unsqueeze(3) * kb.unsqueeze(2), -1)                    # [B,H,Lq,BK]
        scores = torch.where(valid, scores, neg_inf)
        active = (b * block <= q_pos).unsqueeze(1)                                    # [B,1,Lq]
        m_b = torch.where(active, scores.amax(-1), zero)
        p = torch.where(valid, pr.exp(scores - m_b.unsqueeze(-1)), zero)
        l_b = pr.tree_sum(p, -1)
        o_b = pr.tree_sum(torch.where(valid.unsqueeze(-1), p.unsqueeze(-1) * vb.unsqueeze(2), zero), -2)
        if b == 0:
            m, l, o = m_b, l_b, o_b
            continue
        m_new = torch.maximum(m, m_b)
        keep = pr.exp(m - m_new)
        take = pr.exp(m_b - m_new)
        l_new = l * keep + l_b * take
        o_new = o * keep.unsqueeze(-1) + o_b * take.unsqueeze(-1)
        m = torch.where(active, m_new, m)
        l = torch.where(active, l_new, l)
        o = torch.where(active.unsqueeze(-1), o_new, o)
    return o / l.unsqueeze(-1)


def strict_logp(h, lm_shards, targets, *, vocab: int, temperature: float = 1.0, tp: int = 1,
                want_logits: bool = False, device: str | None = None):
    """Selected-token log-probability from per-virtual-shard (max, sum-exp, target logit) summaries.

    ``h`` [N, K] (final-normed), ``lm_shards`` [C, K, V/C] (LM head, transposed per shard),
    ``targets`` [N]. Summaries are gathered from the ``tp`` ranks and merged in global vocabulary
    order 0..C-1 whatever ``tp`` is. Returns logp [N] (and the logits [N, vocab] when asked).
    """
    import torch

    if device is not None:
        h, lm_shards, targets = h.to(device), lm_shards.to(device), targets.to(device)
    canonical, _, width = lm_shards.shape
    group = group_for("tp", tp)
    from rlk_kernels.collectives import VirtualGroup
    if _gpu(h) and not want_logits and isinstance(group, VirtualGroup):
        # every rank is emulated here: each fills its shards' summaries into one buffer in global order
        from rlk_kernels.gpu.triton_logp import logp
        return logp(h, lm_shards, targets, vocab=vocab, temperature=temperature,
                    ranks=[virtual_shards(r, tp, canonical) for r in group.local_ranks()])
    summaries = {}
    logit_parts = {}
    for rank in group.local_ranks():
        shards = virtual_shards(rank, tp, canonical)
        logits = strict_linear_rows(h, lm_shards[shards.start:shards.stop], device)      # [S, N, W]
        if temperature != 1.0:
            logits = logits / temperature
        token = torch.arange(shards.start * width, shards.stop * width, device=h.device).view(len(shards), 1, width)
        logits = torch.where(token < vocab, logits, torch.tensor(float("-inf"), dtype=logits.dtype, device=h.device))
        local_max = logits.amax(-1)                                                       # [S, N]
        safe_max = torch.where(torch.isfinite(local_max), local_max, torch.zeros_like(local_max))
        sum_exp = pr.tree_sum(pr.exp(logits - safe_max.unsqueeze(-1)), -1)
        offset = targets.unsqueeze(0) - token[:, :, 0]                                   # [S, N]
        inside = (offset >= 0) & (offset < width)
        picked = logits.gather(-1, offset.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
        summaries[rank] = (safe_max, sum_exp, torch.where(inside, picked, torch.zeros_like(picked)), inside)
        logit_parts[rank] = logits
    gathered = all_gather(group, summaries)
    maxes = [m for part in gathered for m in part[0].unbind(0)]
    sums = [s for part in gathered for s in part[1].unbind(0)]
    picks = [t for part in gathered for t in part[2].unbind(0)]
    insides = [i for part in gathered for i in part[3].unbind(0)]
    run_max, run_sum, target_logit = maxes[0], sums[0], picks[0]
    for shard in range(1, canonical):
        new_max = torch.maximum(run_max, maxes[shard])
        run_sum = run_sum * pr.exp(run_max - new_max) + sums[shard] * pr.exp(maxes[shard] - new_max)
        run_max = new_max
        target_logit = torch.where(insides[shard], picks[shard], target_logit)
    logp = target_logit - (run_max + pr.log(run_sum))
    if not want_logits:
        return logp
    full = torch.cat([p for part in all_gather(group, logit_parts) for p in part.unbind(0)], dim=-1)
    return logp, full[:, :vocab]


# --- weight views per canonical shard ----------------------------------------------------------------

def layer_weights(weights, cfg, index: int, *, strict: bool = True, refill: dict | None = None) -> dict:
    """Layer ``index``'s weights by their short names; with ``strict`` also the strict paths' per-shard
    layouts built once (``qkv_shards``, ``gate_up_shards``) instead of at every call. ``refill``: an
    earlier result for the same layer whose layouts are refilled in place, each part copied straight
    into its slice (a captured CUDA graph keeps reading the same addresses). The layouts are the same
    tensors the calls would build: the same bits."""
    prefix = f"layers.{index}."
    w = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    if strict:
        for name, parts in (("qkv_shards", _qkv_parts), ("gate_up_shards", _gate_up_parts)):
            pieces = parts(w, cfg)
            old = (refill or {}).get(name)
            fits = old is not None and old.shape[1:] == (pieces[0].shape[2], sum(p.shape[1] for p in pieces)) \
                and old.shape[0] == pieces[0].shape[0]
            w[name] = _shard_layout(pieces, old if fits else None)
    return w


def _shard_layout(pieces, out=None):
    """[C, K, cols]: the pieces [C, n_i, K] side by side over each virtual shard's columns (a transposed
    view of their concatenation); into ``out``, such a view, in place when given."""
    import torch
    if out is None:
        return torch.cat(pieces, dim=1).transpose(1, 2)
    rows = out.transpose(1, 2)                   # [C, cols, K], contiguous
    at = 0
    for piece in pieces:
        rows[:, at:at + piece.shape[1]].copy_(piece)
        at += piece.shape[1]
    return out


def _gate_up_parts(w, cfg):
    c = cfg.canonical_tp
    per = cfg.ffn_hidden // c
    return [w["w_gate"].view(c, per, cfg.hidden), w["w_up"].view(c, per, cfg.hidden)]


def _gate_up_shard_weights(w, cfg):
    """[C, K, 2*F/C]: each virtual shard's gate columns, then its up columns."""
    return w["gate_up_shards"] if "gate_up_shards" in w else _shard_layout(_gate_up_parts(w, cfg))


def _qkv_parts(w, cfg):
    c, d = cfg.canonical_tp, cfg.head_dim
    return [w["wq"].view(c, cfg.heads // c * d, cfg.hidden), w["wk"].view(c, cfg.query_groups // c * d, cfg.hidden),
            w["wv"].view(c, cfg.query_groups // c * d, cfg.hidden)]


def _qkv_shard_weights(w, cfg):
    """[C, K, cols] with cols = (Hq/C + 2*Hkv/C) * D: q, k, v columns of each virtual shard."""
    return w["qkv_shards"] if "qkv_shards" in w else _shard_layout(_qkv_parts(w, cfg))


def _split_qkv(out, cfg, shards: int):
    """out [S, M, cols] -> q [M, S*Hq/C, D], k/v [M, S*Hkv/C, D]."""
    c, d = cfg.canonical_tp, cfg.head_dim
    nq, nk = cfg.heads // c * d, cfg.query_groups // c * d
    rows = out.shape[1]
    q = out[..., :nq].reshape(shards, rows, -1, d).permute(1, 0, 2, 3).reshape(rows, -1, d)
    k = out[..., nq:nq + nk].reshape(shards, rows, -1, d).permute(1, 0, 2, 3).reshape(rows, -1, d)
    v = out[..., nq + nk:].reshape(shards, rows, -1, d).permute(1, 0, 2, 3).reshape(rows, -1, d)
    return q, k, v


def qkv_projection(impl, w, cfg, x, tp):
    """Column-parallel QKV: rows [M, H] -> q [M, Hq, D], k, v [M, Hkv, D] (heads in global order)."""
    import torch
    group = group_for("tp", tp)
    shard_w = _qkv_shard_weights(w, cfg)
    per_rank = {}
    for rank in group.local_ranks():
        shards = virtual_shards(rank, tp, cfg.canonical_tp)
        wr = shard_w[shards.start:shards.stop]
        if impl == "R":
            out = strict_linear_rows(x, wr)
        else:
            # one GEMM over the rank's whole column slice, as a framework does
            cols = wr.shape[2]
            out = (x @ wr.permute(1, 0, 2).reshape(cfg.hidden, -1)).view(x.shape[0], len(shards), cols).permute(1, 0, 2)
        per_rank[rank] = _split_qkv(out, cfg, len(shards))
    parts = all_gather(group, per_rank)
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat([p[i] for p in parts], dim=1) for i in range(3))


def o_projection(impl, w, cfg, attn, tp):
    """Row-parallel output projection: attn [M, Hq, D] -> [M, H]."""
    group = group_for("tp", tp)
    c = cfg.canonical_tp
    rows = attn.shape[0]
    per = cfg.heads // c
    local = {}
    for rank in group.local_ranks():
        shards = virtual_shards(rank, tp, c)
        if impl == "R":
            xs = attn.reshape(rows, c, per * cfg.head_dim)[:, shards.start:shards.stop].transpose(0, 1)
            ws = w["wo"].view(cfg.hidden, c, per * cfg.head_dim)[:, shards.start:shards.stop].permute(1, 2, 0)
            local[rank] = strict_linear_tree(xs, ws)
        else:
            heads = slice(shards.start * per, shards.stop * per)
            xr = attn[:, heads].reshape(rows, -1)
            wr = w["wo"][:, heads.start * cfg.head_dim:heads.stop * cfg.head_dim]
            local[rank] = xr @ wr.t()
    if impl == "R":
        return strict_linear_reduce(group, local)
    return all_reduce_rank_order(group, local)


def _rope(x, pos, rope):
    """x [..., L, D] with positions pos broadcastable to [..., L]; rotate-half convention."""
    import torch
    cos, sin = rope
    c, s = cos[pos], sin[pos]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _project_heads(impl, w, cfg, rope, x, pos, tp):
    """x [B, L, H] at positions pos [B, L] -> q [B, Hq, L, D] (scaled for R), k, v [B, Hkv, L, D]."""
    import torch
    b, length, _ = x.shape
    normed = _norm(impl, x, w["input_norm"], cfg.norm_eps).reshape(b * length, cfg.hidden)
    if impl == "R" and normed.dtype == torch.bfloat16 and _gpu(normed):
        return _project_heads_fused(w, cfg, rope, normed, pos, tp)
    q, k, v = qkv_projection(impl, w, cfg, normed, tp)
    q = _norm(impl, q, w["q_norm"], cfg.norm_eps).view(b, length, cfg.heads, cfg.head_dim).transpose(1, 2)
    k = _norm(impl, k, w["k_norm"], cfg.norm_eps).view(b, length, cfg.query_groups, cfg.head_dim).transpose(1, 2)
    v = v.view(b, length, cfg.query_groups, cfg.head_dim).transpose(1, 2)
    q = _rope(q, pos.unsqueeze(1), rope)
    k = _rope(k, pos.unsqueeze(1), rope)
    if impl == "R":
        q = q * (cfg.head_dim ** -0.5)
    return q, k, v


def _project_heads_fused(w, cfg, rope, normed, pos, tp):
    """R on the GPU (bf16): the ranks' QKV GEMM outputs gathered in shard order, then q/k RMSNorm,
    RoPE, q's scale and the head split of q, k and v in one kernel (``qkv_glue``: one program per
    token, rounding where the eager bf16 ops round; the norm's sum of squares is a per-head tile
    reduction, so its bits may differ from the path above by a rounding, the same in every layout)."""
    import torch
    from rlk_kernels.gpu.triton_pointwise import qkv_glue
    group = group_for("tp", tp)
    c, d = cfg.canonical_tp, cfg.head_dim
    shard_w = _qkv_shard_weights(w, cfg)
    per_rank = {}
    for rank in group.local_ranks():
        shards = virtual_shards(rank, tp, c)
        per_rank[rank] = strict_linear_rows(normed, shard_w[shards.start:shards.stop])
    parts = all_gather(group, per_rank)
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)          # [C, M, cols]
    cos, sin = rope
    return qkv_glue(out, w["q_norm"], w["k_norm"], cfg.norm_eps, cos, sin, pos, heads=cfg.heads,
                    groups=cfg.query_groups, scale=d ** -0.5)


def _sdpa(q, k, v, *, causal=False, mask=None):
    import torch.nn.functional as F
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _ring_attention(q, q_pos, kv_by_rank, pos_by_rank, own):
    """Production CP: partial attention per KV chunk in ring order from the own rank, merged by LSE."""
    import torch
    scale = q.shape[-1] ** -0.5
    cp = len(kv_by_rank)
    out = lse = None
    for step in range(cp):
        src = (own - step) % cp
        k, v = kv_by_rank[src]
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) * scale
        allowed = pos_by_rank[src][:, None, None, :] <= q_pos[:, None, :, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        part_lse = torch.logsumexp(scores, dim=-1)
        part = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v
        if out is None:
            out, lse = part, part_lse
            continue
        new_lse = torch.logaddexp(lse, part_lse)
        out = out * torch.exp(lse - new_lse).nan_to_num(0.0).unsqueeze(-1) \
            + part * torch.exp(part_lse - new_lse).nan_to_num(0.0).unsqueeze(-1)
        lse = new_lse
    return out


def _positions_tensor(positions, device):
    """A list of positions as a long tensor on ``device``; a run of consecutive positions is made
    there (``arange``), not copied from the host (a copy that waits for the GPU's queue to drain)."""
    import torch
    positions = list(positions)
    if positions and positions == list(range(positions[0], positions[0] + len(positions))):
        return torch.arange(positions[0], positions[0] + len(positions), dtype=torch.long, device=device)
    return torch.tensor(positions, dtype=torch.long, device=device)


def attention_module_train(impl, w, cfg, rope, xs, positions, tp):
    """Training-side attention over a full sequence split across CP ranks.

    ``xs[c]`` [B, Lc, H] are CP rank c's tokens at global positions ``positions[c]`` (a list of ints);
    the CP ranks all-gather K/V into global order. Returns the per-rank outputs.
    """
    import torch
    _check_impl(impl)
    cp = len(xs)
    batch = xs[0].shape[0]
    cp_group = group_for("cp", cp)
    local_q, local_kv, pos_t = {}, {}, {}
    for c in cp_group.local_ranks():
        pos_t[c] = _positions_tensor(positions[c], xs[c].device).unsqueeze(0).expand(batch, -1)
        q, k, v = _project_heads(impl, w, cfg, rope, xs[c], pos_t[c], tp)
        local_q[c], local_kv[c] = q, (k, v)
    gathered = all_gather(cp_group, local_kv)
    length = sum(len(p) for p in positions)
    flat = [p for c in range(cp) for p in positions[c]]
    if flat == list(range(length)):                # the ranks' keys are already in global order
        k_all = gathered[0][0] if cp == 1 else torch.cat([kv[0] for kv in gathered], dim=2)
        v_all = gathered[0][1] if cp == 1 else torch.cat([kv[1] for kv in gathered], dim=2)
    else:
        order = _positions_tensor(flat, xs[0].device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(length, device=order.device)
        k_all = torch.cat([kv[0] for kv in gathered], dim=2)[:, :, inverse]
        v_all = torch.cat([kv[1] for kv in gathered], dim=2)[:, :, inverse]
    outs = []
    for c in cp_group.local_ranks():
        q = local_q[c]
        if impl == "R":
            core = strict_attention(q, k_all, v_all, pos_t[c])
        elif cp == 1:
            core = _sdpa(q, k_all, v_all, causal=True)
        else:
            # every CP rank's positions, not only the ranks hosted here (one rank per process)
            all_pos = [_positions_tensor(p, xs[0].device).unsqueeze(0).expand(batch, -1) for p in positions]
            core = _ring_attention(q, pos_t[c], gathered, all_pos, c)
        rows = core.transpose(1, 2).reshape(-1, cfg.heads, cfg.head_dim)
        outs.append(o_projection(impl, w, cfg, rows, tp).view(batch, -1, cfg.hidden))
    return outs


class KVCache:
    """Per-layer K/V of a rollout engine in global position order: [B, Hkv, capacity, D]."""

    def __init__(self, batch, cfg, capacity, dtype=None):
        import torch
        dtype = dtype or torch.float32
        self.k = torch.zeros(batch, cfg.query_groups, capacity, cfg.head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    def write(self, k, v, pos):
        # pos [B, L]: scatter each sequence's new keys at their global positions
        idx = pos.unsqueeze(1).unsqueeze(-1).expand(-1, k.shape[1], -1, k.shape[3])
        self.k.scatter_(2, idx, k.detach() if not k.requires_grad else k)
        self.v.scatter_(2, idx, v.detach() if not v.requires_grad else v)

    def select(self, rows):
        self.k, self.v = self.k[rows], self.v[rows]


def attention_module_cached(impl, w, cfg, rope, x, pos, tp, cache: KVCache, *, phase: str, keys: int | None = None):
    """Rollout-side attention with a KV cache: ``phase`` "prefill" (all sequences start at 0, same
    length) or "decode" (one new token per sequence, any positions). x [B, L, H], pos [B, L].
    ``keys``: the cache length to attend (the largest position + 1), when the caller knows it: read
    from ``pos`` otherwise, a device-to-host copy a CUDA graph cannot hold."""
    import torch
    _check_impl(impl)
    q, k, v = _project_heads(impl, w, cfg, rope, x, pos, tp)
    cache.write(k, v, pos)
    keys = int(pos.max()) + 1 if keys is None else keys
    kc, vc = cache.k[:, :, :keys], cache.v[:, :, :keys]
    if impl == "R":
        core = strict_attention(q, kc, vc, pos)
    elif phase == "prefill":
        core = _sdpa(q, kc, vc, causal=True)
    else:
        mask = (torch.arange(keys)[None, :] <= pos[:, -1:]).view(x.shape[0], 1, 1, keys)
        core = _sdpa(q, kc, vc, mask=mask)
    rows = core.transpose(1, 2).reshape(-1, cfg.heads, cfg.head_dim)
    return o_projection(impl, w, cfg, rows, tp).view(x.shape[0], x.shape[1], cfg.hidden)


def ffn_module(impl, w, cfg, x, tp):
    """Post-attention RMSNorm + SwiGLU FFN on rows x [M, H] -> [M, H] (the residual is the caller's)."""
    import torch
    import torch.nn.functional as F
    _check_impl(impl)
    c = cfg.canonical_tp
    per = cfg.ffn_hidden // c
    group = group_for("tp", tp)
    normed = _norm(impl, x, w["post_norm"], cfg.norm_eps)
    gate_up = _gate_up_shard_weights(w, cfg)
    down = w["w_down"].view(cfg.hidden, c, per).permute(1, 2, 0)                     # [C, per, H]
    local = {}
    for rank in group.local_ranks():
        shards = virtual_shards(rank, tp, c)
        if impl == "R":
            if _gpu(normed):
                # gate/up GEMM with SwiGLU in its epilogue (the same bits as the stored gate/up path)
                from rlk_kernels.gpu.triton_gemm import shard_swiglu
                act = shard_swiglu(normed, gate_up[shards.start:shards.stop], per)
            else:
                gu = strict_linear_rows(normed, gate_up[shards.start:shards.stop])      # [S, M, 2*per]
                act = pr.silu(gu[..., :per]) * gu[..., per:]
            local[rank] = strict_linear_tree(act, down[shards.start:shards.stop])
        else:
            gw = w["w_gate"][shards.start * per:shards.stop * per]
            uw = w["w_up"][shards.start * per:shards.stop * per]
            gu = normed @ torch.cat([gw, uw]).t()
            n = gw.shape[0]
            act = F.silu(gu[:, :n]) * gu[:, n:]
            local[rank] = act @ w["w_down"][:, shards.start * per:shards.stop * per].t()
    if impl == "R":
        return strict_linear_reduce(group, local)
    return all_reduce_rank_order(group, local)


LOGP_SLICES = 8       # the LM head's vocabulary is summarised in at least this many slices


def logp_slices(cfg) -> int:
    """Vocabulary slices of the strict log-prob: the canonical width, but at least :data:`LOGP_SLICES`
    where the padded vocabulary divides evenly. A narrower width (TP1-only arms) keeps the summaries'
    fold as short as width 8's -- each slice's tiles in order, then the slices in order -- instead of
    one program walking the whole vocabulary per row; any width's TP ranks hold whole slices."""
    c = cfg.canonical_tp
    return LOGP_SLICES if c < LOGP_SLICES and cfg.padded_vocab % LOGP_SLICES == 0 else c


def lm_head_shards(weights, cfg):
    slices = logp_slices(cfg)
    return weights["lm_head"].view(slices, cfg.padded_vocab // slices, cfg.hidden).transpose(1, 2)


def logp_module(impl, weights, cfg, x, targets, tp, *, temperature=1.0, want_logits=False, side="train"):
    """Final RMSNorm + LM head + selected-token logp on rows x [M, H]; targets [M].

    Production differs by side, as the frameworks do: training (Megatron) uses the vocabulary-parallel
    form (global max, per-rank sum-exp all-reduced in rank order); rollout (vLLM) gathers the logits
    and takes a log-softmax. The strict form is the same on both sides.
    """
    import torch
    _check_impl(impl)
    normed = _norm(impl, x, weights["final_norm"], cfg.norm_eps)
    if impl == "R":
        return strict_logp(normed, lm_head_shards(weights, cfg), targets, vocab=cfg.vocab,
                           temperature=temperature, tp=tp, want_logits=want_logits)
    group = group_for("tp", tp)
    width = cfg.padded_vocab // tp
    local = {}
    for r in group.local_ranks():
        logits = normed @ weights["lm_head"][r * width:(r + 1) * width].t()
        if temperature != 1.0:
            logits = logits / temperature
        token = torch.arange(r * width, (r + 1) * width)
        local[r] = logits.masked_fill(token >= cfg.vocab, float("-inf"))
    parts = all_gather(group, local)
    gathered = torch.cat(parts, dim=-1)[:, :cfg.vocab]
    safe = targets.clamp(0, cfg.vocab - 1)
    if side == "rollout":
        logp = torch.log_softmax(gathered, dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    else:
        global_max = torch.stack([p.amax(-1) for p in parts]).amax(0).detach()
        sum_exp = all_reduce_rank_order(group, {r: torch.exp(local[r] - global_max[:, None]).sum(-1) for r in group.local_ranks()})
        target_logit = gathered.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        logp = target_logit - global_max - torch.log(sum_exp)
    return (logp, gathered) if want_logits else logp
