"""Lowering passes over tile programs, each a function kernel -> kernel, and the pipelines
that run them per target.

Each pipeline is one flat list, read top to bottom; a comment says why a pass comes where it
does. Every pass is tested by comparing its result with an expected program
(tests/unit/test_tile_passes.py), and the verifier runs after the whole pipeline
(`tilekit.codegen.kernel.generated`).
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.tile.nodes import Kernel
from tilekit.tile.passes.barriers import drop_redundant_barriers
from tilekit.tile.passes.copies import lower_copies, vectorize
from tilekit.tile.passes.guards import split_guards
from tilekit.tile.passes.layout import pad_shared_rows
from tilekit.tile.passes.pipeline import pipeline
from tilekit.tile.passes.threads import serialize_threads

#: CUDA (sm_80 and sm_90): tile operations become loops over the block's threads.
CUDA_PIPELINE = (
    pad_shared_rows,    # first: layouts change buffer sizes, which nothing after may assume
    pipeline,           # on copies still whole: it moves and duplicates them per stage
    vectorize,          # on whole copies: the proof reads each copy's tile and offsets
    lower_copies,       # copies to thread regions (thread binding), with their vector width
    drop_redundant_barriers,   # last: after every pass that places barriers
)


#: CPUs: the same tile operations, then a block's threads one after another.
CPU_PIPELINE = (
    pad_shared_rows,
    pipeline,           # (no CPU program pipelines today: a no-op kept for one form)
    lower_copies,       # copies to thread regions, one element per access
    serialize_threads,  # after every pass that makes regions: regions become serial loops
    split_guards,       # last: guarded vector loops (padding) split around their interior
)


def lower_for_cuda(k: Kernel) -> Kernel:
    """`k` and the kernels it composes, lowered for CUDA (every pass is idempotent: a
    composed body arrives lowered already)."""
    for p in CUDA_PIPELINE:
        k = p(k)
    return replace(k, calls=tuple(lower_for_cuda(c) for c in k.calls))


def lower_for_cpu(k: Kernel) -> Kernel:
    for p in CPU_PIPELINE:
        k = p(k)
    return replace(k, calls=tuple(lower_for_cpu(c) for c in k.calls))


__all__ = ["CPU_PIPELINE", "CUDA_PIPELINE", "lower_for_cpu", "lower_for_cuda"]
