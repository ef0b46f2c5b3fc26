"""One block for several kernel bodies: the rule that tk-grind's cost model and codegen share.

A persistent kernel (a tk-grind device loop, a tk-ram program segment) runs the bodies of
several kernels on blocks of one size. A body may run on a block of another size when:

- it synchronises its block (`__syncthreads`: the `staged`, `simt`, `mma` and `wgmma`
  shapes, every fused group): only on exactly its own threads, since every thread of the
  block must reach each barrier;
- it has fewer threads than the block and its threads never exchange values: on the first of
  the block's threads (`if (threadIdx.x < t)`); with warp collectives (a default kernel with
  lanes) only when it covers whole warps (`t % 32 == 0`);
- it has more threads than the block, a multiple, and its threads never exchange values: each
  thread of the block stands in for several (the CUDA printer's thread-strided form, tilekit.tile.cuda).

`shared_block` picks the block: the threads of the bodies with barriers (they must agree),
else the largest body's; `runs_on` says why one body cannot run on a given block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from tilekit.schedule.defaults import WARP

#: Kernel shapes (tilekit.schedule.shape) of one op whose blocks synchronise at barriers
#: (shared-memory tiles written by some threads and read by others); a kernel of several ops
#: (a fused group) always does. The `tiled` and `default` shapes never do.
BARRIER_SHAPES = frozenset({"staged", "simt", "mma", "wgmma"})


@dataclass(frozen=True)
class BodyBlock:
    """What the rule needs to know of one body."""

    name: str
    threads: int
    barriers: bool       # synchronises its block
    independent: bool    # its threads never exchange values (no barrier, no warp collective)


def runs_on(body: BodyBlock, threads: int) -> str | None:
    """Why `body` cannot run on blocks of `threads` threads (None: it can)."""
    t = body.threads
    if body.barriers and t != threads:
        return f"body kernel {body.name} synchronises {t} threads, the block has {threads}"
    if t > threads and (t % threads or not body.independent):
        return (f"body kernel {body.name} uses {t} threads that exchange values, the "
                f"persistent block has {threads}")
    if t < threads and t % WARP and not body.independent:
        return (f"body kernel {body.name} uses warp collectives on {t} threads, a part of "
                f"a warp of the persistent block's {threads}")
    return None


def shared_block(bodies: Iterable[BodyBlock]) -> int | str:
    """The threads of a block that runs every body, or why there is none."""
    bodies = list(bodies)
    barrier = {b.threads for b in bodies if b.barriers}
    if len(barrier) > 1:
        return (f"body kernels with block barriers use different block sizes "
                f"({', '.join(map(str, sorted(barrier)))} threads)")
    threads = barrier.pop() if barrier else max(b.threads for b in bodies)
    for b in bodies:
        why = runs_on(b, threads)
        if why:
            return why
    return threads


__all__ = ["BARRIER_SHAPES", "BodyBlock", "runs_on", "shared_block"]
