"""What every persistent kernel is made of: kernel bodies composed on one resident block.

tk-ram's program kernels (tilekit.codegen.program) and tk-grind's device loops
(tilekit.codegen.control) differ in how they walk their bodies (work lists with progress
counters; a loop with grid barriers) and share the rest, which lives here:

- `block_threads(bodies)`: the block's threads, by the rule tk-grind's cost model applies
  too (tilekit.schedule.block), from what each body's tile program says of itself (its
  barriers and warp collectives);
- `call(g, block, nblocks)`: the statement that runs body `g` as block `block` of its own
  grid on the persistent block (the CUDA printer guards it to its threads, or runs it
  thread-strided, by comparing the two blocks' threads);
- `Params`: the tensors the kernel touches, in order of first use, written ones not `const`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from tilekit.codegen.kernel import GeneratedKernel, tvar
from tilekit.ir.model import Tensor
from tilekit.schedule.block import BodyBlock, runs_on, shared_block
from tilekit.tile.expr import Expr
from tilekit.tile.nodes import Buffer, CallBody, threads_independent, uses_barriers


def body_block(g: GeneratedKernel) -> BodyBlock:
    """Body `g` as the shared-block rule sees it."""
    return BodyBlock(g.entry, g.program.threads, uses_barriers(g.program),
                     threads_independent(g.program))


def block_threads(bodies: list[GeneratedKernel]) -> int | str:
    """The persistent block's threads for `bodies`, or why they cannot share one block."""
    return shared_block([body_block(g) for g in bodies])


def fits_block(g: GeneratedKernel, threads: int) -> str | None:
    """Why body `g` cannot run on blocks of `threads` threads (None: it can)."""
    return runs_on(body_block(g), threads)


def call(g: GeneratedKernel, block: Expr, nblocks: Expr) -> CallBody:
    """Run body `g` as block `block` of a grid of `nblocks` (its own grid)."""
    return CallBody(g.entry, tuple(p.name for p in g.program.params), block, nblocks)


@dataclass
class Params:
    """Every tensor a persistent kernel touches, in order of first use, and which it
    writes: its parameters (read-only ones `const`; each tensor is one parameter)."""

    decl: Mapping[str, Tensor]
    order: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)

    def use(self, name: str, write: bool = False) -> str:
        """The tensor's buffer name, recording its use."""
        if name not in self.order:
            self.order.append(name)
        if write:
            self.written.add(name)
        return tvar(name)

    def use_body(self, g: GeneratedKernel) -> None:
        """Every tensor body `g` reads or writes."""
        for t in g.args:
            self.use(t, t in g.writes)

    def buffers(self) -> tuple[Buffer, ...]:
        out = []
        for t in self.order:
            tensor = self.decl[t]
            out.append(Buffer(tvar(t), "global", tensor.dtype, (max(1, tensor.size),),
                              access="write" if t in self.written else "read", comment=t))
        return tuple(out)

    def writes(self) -> tuple[str, ...]:
        return tuple(t for t in self.order if t in self.written)


__all__ = ["Params", "block_threads", "body_block", "call", "fits_block"]
