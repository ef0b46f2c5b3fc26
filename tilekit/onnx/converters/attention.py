"""Attention (opset 23): scaled dot-product attention as the statements an exported
attention block is made of, so that later stages see (and fuse) the same chain.

`Q @ K^T` (heads split from 3-D inputs by an index map, grouped-query heads read as
`h // group`), one statement for scale, softcap, mask and causal frontier, the softmax chain
(`max=`, `+= exp`, `= exp / s`) and `P @ V`; with `past_key`/`past_value` the present key and
value are the concatenation along the sequence (outputs 1 and 2). Refused: the
`qk_matmul_output` output, `nonpad_kv_seqlen` and sliding windows, a mask shorter than the
key sequence (opset 24's padding). A row that every key is masked from gives NaN here (the
ONNX reference gives 0).
"""

from __future__ import annotations

import math

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter

_4D = ("b", "h", "i", "k")


def _heads(ctx: NodeContext, v: Value, attr: str) -> int:
    """Head count of a Q/K/V input: its dim 1 when 4-D, the attribute when 3-D."""
    if v.rank == 4:
        return v.shape[1]
    if v.rank != 3:
        raise ctx.unsupported(f"input '{v.name}' of rank {v.rank}; expected 3 or 4")
    heads = ctx.attr(attr)
    if not heads or v.shape[2] % int(heads):
        raise ctx.unsupported(f"3-D input '{v.name}' needs {attr} dividing its hidden size "
                              f"{v.shape[2]} (got {heads})")
    return int(heads)


def _head_read(ctx: NodeContext, v: Value, b: str, h: str, s: str, d: str, size: int) -> str:
    """`v[b, h, s, d]` of a 4-D input, or of a 3-D one split into heads of `size`."""
    if v.rank == 4:
        return ctx.access(v, [b, h, s, d])
    return ctx.access(v, [b, s, f"({h})*{size} + {d}"])


def _present(ctx: NodeContext, out_index: int, past: Value, cur: Value, heads: int,
             size: int) -> Value:
    """past ++ cur along the sequence (4-D), written to output `out_index` when it is read
    and to a temporary otherwise."""
    p = past.shape[2]
    seq = p + (cur.shape[2] if cur.rank == 4 else cur.shape[1])
    shape = (cur.shape[0], heads, seq, size)
    step = "present_key" if out_index == 1 else "present_value"
    used = ctx.n_outputs > out_index and ctx.output_used(out_index)
    out = ctx.output(out_index) if used else ctx.temp(step, shape, cur.dtype)
    old = ctx.access(past, ["b", "h", "t", "k"])
    new = _head_read(ctx, cur, "b", "h", text.term([("t", 1)], -p), "k", size)
    ctx.assign(out, ["b", "h", "t", "k"], "=", text.select_by_range("t", [0, p], [old, new]),
               pad="0", step=step)
    return out


@converter("Attention", summary="s += q*k (heads by index map); z = scale, softcap, mask, "
                                "causal; softmax over keys; y += p*v")
def attention(ctx: NodeContext) -> None:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if not (q.rank == k.rank == v.rank):
        raise ctx.unsupported("Q, K and V of different ranks")
    if ctx.has_input(6):
        raise ctx.unsupported("input nonpad_kv_seqlen (an external KV cache)",
                              "export without a static cache")
    for name in ("left_window_size", "right_window_size"):
        if int(ctx.attr(name, -1)) != -1:
            raise ctx.unsupported(f"{name}={ctx.attr(name)} (sliding window)")
    if ctx.n_outputs > 3 and ctx.output_used(3):
        raise ctx.unsupported("output qk_matmul_output is used")
    ctx.attr("qk_matmul_output_mode", 0)  # only shapes output 3, refused above when read
    # The softmax runs in the inputs' type here (it is float32 for float32 models).
    ctx.attr("softmax_precision", None)
    hq = _heads(ctx, q, "q_num_heads")
    hk = _heads(ctx, k, "kv_num_heads")
    hv = _heads(ctx, v, "kv_num_heads")
    if hk != hv or hq % hk:
        raise ctx.unsupported(f"{hq} query heads over {hk} key and {hv} value heads; "
                              "need equal key and value heads dividing the query heads")
    dq = q.shape[3] if q.rank == 4 else q.shape[2] // hq
    dk = k.shape[3] if k.rank == 4 else k.shape[2] // hk
    dv = v.shape[3] if v.rank == 4 else v.shape[2] // hv
    if dq != dk:
        raise ctx.unsupported(f"query head size {dq} differs from key head size {dk}")
    batch = q.shape[0]
    sq = q.shape[2] if q.rank == 4 else q.shape[1]
    past_k, past_v = ctx.input(4), ctx.input(5)
    if (past_k is None) != (past_v is None):
        raise ctx.unsupported("past_key without past_value (or the reverse)")
    if past_k is not None:
        k = _present(ctx, 1, past_k, k, hk, dk)
        v = _present(ctx, 2, past_v, v, hv, dv)
        offset = past_k.shape[2]
    else:
        offset = 0
        for i, cur in ((1, k), (2, v)):
            if ctx.n_outputs > i and ctx.output_used(i):
                size = dk if i == 1 else dv
                out = ctx.output(i)
                ctx.assign(out, list(_4D), "=", _head_read(ctx, cur, *_4D, size),
                           step="present_key" if i == 1 else "present_value")
    total = k.shape[2] if k.rank == 4 else k.shape[1]
    group = hq // hk
    kv_h = "h" if group == 1 else f"h // {group}"
    dtype = q.dtype

    # scores[b, h, i, j] = sum_k q[b, h, i, k] * k[b, h // group, j, k]
    scores = ctx.temp("scores", (batch, hq, sq, total), dtype)
    ctx.assign(scores, ["b", "h", "i", "j"], "+=",
               f"{_head_read(ctx, q, 'b', 'h', 'i', 'k', dq)} * "
               f"{_head_read(ctx, k, 'b', kv_h, 'j', 'k', dk)}", extents={"k": dq},
               step="scores")
    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(dq) if scale is None else float(scale)
    z = f"{ctx.access(scores, ['b', 'h', 'i', 'j'])} * {text.literal(scale, dtype)}"
    softcap = float(ctx.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        cap = text.literal(softcap, dtype)
        z = f"{cap} * tanh({z} / {cap})"
    ninf = text.literal(float("-inf"), dtype)
    mask = ctx.input(3)
    if mask is not None:
        if mask.rank < 2 or mask.shape[-1] != total:
            raise ctx.unsupported(f"attn_mask of shape {list(mask.shape)} for {total} keys",
                                  "give a mask as long as the key sequence")
        read = ctx.read(mask, ["b", "h", "i", "j"], (batch, hq, sq, total), inline=False)
        z = f"select({read}, {z}, {ninf})" if mask.dtype == "bool" else f"{z} + {read}"
    if int(ctx.attr("is_causal", 0)):
        z = f"select(j <= {text.term([('i', 1)], offset)}, {z}, {ninf})"
    logits = ctx.temp("logits", (batch, hq, sq, total), dtype)
    ctx.assign(logits, ["b", "h", "i", "j"], "=", z, step="logits")

    # softmax over j, as the Softmax converter writes it
    row = (batch, hq, sq)
    m = ctx.temp("max", row, dtype)
    ctx.assign(m, ["b", "h", "i"], "max=", ctx.access(logits, ["b", "h", "i", "r"]), step="max")
    s = ctx.temp("sum", row, dtype)
    ma = ctx.access(m, ["b", "h", "i"])
    ctx.assign(s, ["b", "h", "i"], "+=",
               f"exp({ctx.access(logits, ['b', 'h', 'i', 'r'])} - {ma})", step="sum")
    p = ctx.temp("probs", (batch, hq, sq, total), dtype)
    ctx.assign(p, ["b", "h", "i", "j"], "=",
               f"exp({ctx.access(logits, ['b', 'h', 'i', 'j'])} - {ma}) / "
               f"{ctx.access(s, ['b', 'h', 'i'])}", step="probs")

    out = ctx.output(0)
    pv = f"{ctx.access(p, ['b', 'h', 'i', 'k'])} * {_head_read(ctx, v, 'b', kv_h, 'k', 'j', dv)}"
    if q.rank == 4:
        ctx.assign(out, ["b", "h", "i", "j"], "+=", pv)
        return
    y4 = ctx.temp("heads", (batch, hq, sq, dv), dtype)
    ctx.assign(y4, ["b", "h", "i", "j"], "+=", pv, step="heads")
    ctx.assign(out, ["b", "i", "j"], "=", ctx.access(y4, ["b", f"j // {dv}", "i", f"j % {dv}"]))
