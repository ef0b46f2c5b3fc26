"""What every persistent kernel is made of: kernel bodies composed on one resident block.

tk-ram's program kernels (tilekit.codegen.program) and tk-grind's device loops
(tilekit.codegen.control) differ in how they walk their bodies (work lists with progress
counters; a loop with grid barriers) and share the rest, which lives here:

- `block_threads(bodies)`: the block's threads, by the rule tk-grind's cost model applies
  too (tilekit.schedule.block), from what codegen knows of each body (its barriers and warp
  collectives, read off the built kernel);
- `body_functions(bodies, threads)`: each body's `__device__` function, in its
  thread-strided form where the body has more threads than the block;
- `body_call(g, block, threads)`: the statement that runs body `g` as block `block` of its own
  grid on the persistent block (guarded to its threads, or thread-strided);
- `Params`: the tensors the kernel touches, in order of first use, written ones not `const`;
- `smem_declaration(smem)`: the one shared-memory base all bodies carve their buffers from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from tilekit.codegen.builder import SMEM
from tilekit.codegen.cexpr import storage
from tilekit.codegen.kernel import GeneratedKernel, tvar
from tilekit.ir.model import Tensor
from tilekit.schedule.block import BodyBlock, runs_on, shared_block
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT


def body_block(g: GeneratedKernel) -> BodyBlock | str:
    """Body `g` as the shared-block rule sees it, or why it has no composable body."""
    if g.spec is None:
        return f"kernel {g.entry} has no composable body"
    return BodyBlock(g.entry, g.block[0] * g.block[1] * g.block[2],
                     g.spec.uses_block_barriers(), g.spec.threads_independent())


def block_threads(bodies: list[GeneratedKernel]) -> int | str:
    """The persistent block's threads for `bodies`, or why they cannot share one block."""
    blocks = [body_block(g) for g in bodies]
    for b in blocks:
        if isinstance(b, str):
            return b
    return shared_block(blocks)


def fits_block(g: GeneratedKernel, threads: int) -> str | None:
    """Why body `g` cannot run on blocks of `threads` threads (None: it can)."""
    b = body_block(g)
    return b if isinstance(b, str) else runs_on(b, threads)


def body_functions(bodies: list[GeneratedKernel], threads: int) -> str:
    """Each body's `__device__` function (thread-strided when it has more threads)."""
    return "".join((g.spec.thread_strided_function() if g.block[0] > threads
                    else g.spec.device_function()) + "\n" for g in bodies)


def body_call(g: GeneratedKernel, block: str, threads: int) -> str:
    """The statement that runs body `g` as block `block` (an expression) of its own grid on
    a persistent block of `threads` threads, reading the shared base `SMEM`."""
    blocks = g.grid[0] * g.grid[1] * g.grid[2]
    t = g.block[0]
    args = ", ".join([tvar(a) for a in g.args] + [block, str(blocks), SMEM])
    if t > threads:
        return (f"for (int tk_s = 0; tk_s < {t // threads}; ++tk_s) "
                f"{g.spec.body_name}_t({args}, (int)threadIdx.x + tk_s * {threads});")
    call = f"{g.spec.body_name}({args});"
    return call if t == threads else f"if (threadIdx.x < {t}) {call}"


def smem_declaration(smem: int) -> str:
    """The shared-memory base of `smem` bytes (dynamic above the static limit)."""
    if smem > STATIC_SMEM_LIMIT:
        return f"TK_DYNAMIC_SMEM({SMEM});"
    return f"TK_STATIC_SMEM({SMEM}, {max(smem, 16)});"


@dataclass
class Params:
    """Every tensor a persistent kernel touches, in order of first use, and which it
    writes: its parameters (read-only ones `const`; each tensor is one parameter, so all are
    `__restrict__`)."""

    decl: Mapping[str, Tensor]
    order: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)

    def use(self, name: str, write: bool = False) -> str:
        """The tensor's C name, recording its use."""
        if name not in self.order:
            self.order.append(name)
        if write:
            self.written.add(name)
        return tvar(name)

    def use_body(self, g: GeneratedKernel) -> None:
        """Every tensor body `g` reads or writes."""
        for t in g.args:
            self.use(t, t in g.writes)

    def declarations(self) -> list[str]:
        return [f"{'' if t in self.written else 'const '}{storage(self.decl[t].dtype).ctype}* "
                f"__restrict__ {tvar(t)}" for t in self.order]

    def writes(self) -> tuple[str, ...]:
        return tuple(t for t in self.order if t in self.written)


__all__ = ["Params", "block_threads", "body_block", "body_call", "body_functions",
           "fits_block", "smem_declaration"]
