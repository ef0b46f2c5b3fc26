"""The attention pattern of a group, and the flash form of its kernel (online softmax).

A group whose five stages are

    S:  s[.., i, j] += q[.., i, d] * k[.., j, d]        (any contraction; chained ops such as
                                                         a scale and a mask give the scores sm)
    M:  mx[.., i]   max= sm[.., i, r]
    L:  den[.., i]  += exp(sm[.., i, r] - mx[.., i])
    P:  p[.., i, j] = exp(sm[.., i, j] - mx[.., i]) / den[.., i]
    O:  o[.., i, e] += p[.., i, j] * v[.., j, e]        (or v * p; chained ops may follow)

computes `o = sum_j exp(sm - max) v / sum_j exp(sm - max)`, which does not need a whole row of
scores at once: walking the key axis `j` in steps, a block keeps per row the running max `m`,
the running sum `l` and the output accumulators, and at every step rescales them by
`exp(m_old - m_new)` (the online softmax of flash attention). `match` recognises the
pattern exactly (anything else is not attention); a group gets the flash form when its key
axis is longer than `FLASH_STEP` (the key axis is then split in steps of `FLASH_STEP`; the
scores of one step, the running max, sum and rescale factor live in shared memory, the
accumulators in registers).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilekit.expr.ast import Access, Axis, Binary, Call, Node, body_accesses
from tilekit.ir.graph import graph
from tilekit.ir.model import Module
from tilekit.weld.structure import Structure

#: Keys per step of the flash form; a key axis at most this long stays whole in the block.
FLASH_STEP = 64
#: Output points a thread accumulates in registers, at most (flash form).
FLASH_POINTS_PER_THREAD = 8
#: Threads of a flash block.
FLASH_THREADS = 128


@dataclass(frozen=True)
class Attention:
    """Where the pattern sits in its group (member positions) and the axes of its output op
    O: `key` (its reduction axis, the softmax axis), `rows` (its spatial axes indexing the
    probabilities, in their order), `cols` (its other spatial axes)."""

    stages: tuple[int, int, int, int, int]     # member positions of S, M, L, P, O mains
    scores: str
    key: str
    key_extent: int
    rows: tuple[str, ...]
    cols: tuple[str, ...]


def _plain(access: Node, tensor: str, axes) -> bool:
    return (isinstance(access, Access) and access.tensor == tensor
            and len(access.indices) == len(axes)
            and all(isinstance(i, Axis) and i.name == a for i, a in zip(access.indices, axes)))


def _exp_centered(node: Node, scores: str, stat: str, axes, key: str) -> bool:
    """`exp(scores[axes..., key] - stat[axes...])`."""
    return (isinstance(node, Call) and node.fn == "exp" and len(node.args) == 1
            and isinstance(node.args[0], Binary) and node.args[0].op == "-"
            and _plain(node.args[0].lhs, scores, (*axes, key))
            and _plain(node.args[0].rhs, stat, axes))


def match(module: Module, s: Structure) -> Attention | None:
    """The attention pattern of group `s` (module docstring), or None."""
    if s.stages != 5:
        return None
    g = graph(module)
    mains = [k for k, r in enumerate(s.roles) if r == "stage"]
    a_s, a_m, a_l, a_p, a_o = (g.nodes[s.members[k]].analysis for k in mains)
    stage0 = [k for k, st in enumerate(s.stage_of) if st == 0 and s.roles[k] != "inline"]
    scores = g.nodes[s.members[stage0[-1]]].writes[0]
    if not a_s.reduction or any(r == "inline" for r in s.roles):
        return None
    mx, den, p = a_m.output, a_l.output, a_p.output
    if a_m.assign != "max=" or len(a_m.reduction) != 1:
        return None
    m_axes = [a for a, _ in a_m.spatial]
    if not _plain(a_m.stmt.body, scores, (*m_axes, a_m.reduction[0][0])):
        return None
    if a_l.assign != "+=" or len(a_l.reduction) != 1:
        return None
    l_axes = [a for a, _ in a_l.spatial]
    if not _exp_centered(a_l.stmt.body, scores, mx, l_axes, a_l.reduction[0][0]):
        return None
    if a_p.assign != "=" or a_p.reduction:
        return None
    p_axes = [a for a, _ in a_p.spatial]
    body = a_p.stmt.body
    if not (isinstance(body, Binary) and body.op == "/"
            and _exp_centered(body.lhs, scores, mx, p_axes[:-1], p_axes[-1])
            and _plain(body.rhs, den, p_axes[:-1])):
        return None
    if a_o.assign != "+=" or len(a_o.reduction) != 1:
        return None
    key, key_extent = a_o.reduction[0]
    body = a_o.stmt.body
    if not (isinstance(body, Binary) and body.op == "*"):
        return None
    prob, other = (body.lhs, body.rhs) if isinstance(body.lhs, Access) and \
        body.lhs.tensor == p else (body.rhs, body.lhs)
    written = {g.nodes[i].writes[0] for i in s.members}
    if not (isinstance(prob, Access) and prob.tensor == p):
        return None
    idx = prob.indices
    if not all(isinstance(i, Axis) for i in idx) or idx[-1].name != key:
        return None
    rows = tuple(i.name for i in idx[:-1])
    spatial = [a for a, _ in a_o.spatial]
    if len(set(rows)) != len(rows) or not set(rows) <= set(spatial):
        return None
    if any(a.tensor in written for a in body_accesses(other)):
        return None
    # Only O's stage may store: the scores and statistics never exist whole in the flash form.
    last_stage = {g.nodes[s.members[k]].writes[0] for k, st in enumerate(s.stage_of) if st == 4}
    if not set(s.stored) <= last_stage:
        return None
    return Attention(tuple(mains), scores, key, key_extent, rows,
                     tuple(a for a in spatial if a not in rows))


__all__ = ["Attention", "FLASH_POINTS_PER_THREAD", "FLASH_STEP", "FLASH_THREADS", "match"]
