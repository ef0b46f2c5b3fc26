"""The kernel builder: the structured form of a kernel between tiles and text.

Every kernel shape builds a `KernelSpec` through a `KernelBuilder` instead of printing a
`__global__` function directly:

- the **parameters** (the group's tensors, read-only first, from `Signature`);
- the **block index** as a value, never `blockIdx.x`: a body reads `BLOCK` (this block's
  index in the kernel's own grid) and `NBLOCKS` (the grid's size, for grid-stride loops);
- the **shared memory** as buffers carved by one allocator from one base pointer `SMEM`
  (each buffer 16-byte aligned), never `__shared__` declarations of its own;
- the **body**: the statements (index decoding, staging loops, register tiles, the reduction
  loop, the epilogue), written with an `Emitter` into named sections;
- the launch facts: threads per block, grid, whether ptxas gets `(threads, 1)` bounds.

One printer turns a spec into text. `source()` is what tk-codegen emits for a kernel: the body
as a `__device__ __forceinline__` function `<entry>_body(params..., int tk_block,
int tk_nblocks, unsigned char* tk_smem)` and an `extern "C" __global__` entry that calls it
with `blockIdx.x`, `gridDim.x` and its shared memory (a static array up to 48 KB, the dynamic
allocation above). A stage that composes bodies (Rammer's persistent program runs several
kernels' blocks in one launch; Cocktailer's device loops run a body per iteration) calls
`<entry>_body` with the block index and shared-memory base it chooses, with no change to the
body. Inlined, the body compiles to the same code as a kernel written directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilekit.codegen.emitter import INDENT, Emitter, check_line, comment_text
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT
from tilekit.schedule.shape import SMEM_ALIGN

#: The body's view of its launch: block index, grid size, shared-memory base.
BLOCK = "tk_block"
NBLOCKS = "tk_nblocks"
SMEM = "tk_smem"


@dataclass(frozen=True)
class SharedBuffer:
    """One buffer of the body's shared memory: `ctype name[count]` at byte `offset`."""

    name: str
    ctype: str
    count: int
    offset: int
    nbytes: int
    comment: str = ""


@dataclass(frozen=True)
class KernelSpec:
    """A kernel in structured form (see the module docstring)."""

    entry: str
    params: str                         # the C parameter list of the group's tensors
    args: str                           # the same names, as call arguments
    threads: int
    register_tile: bool                 # __launch_bounds__(threads, 1) (module docstring of
                                        # tilekit.codegen.kernel says why)
    comments: tuple[str, ...]
    buffers: tuple[SharedBuffer, ...]
    sections: tuple[tuple[str, str], ...]   # (name, statements), in order

    @property
    def smem_bytes(self) -> int:
        """Shared memory the body uses (static and dynamic alike)."""
        end = max((b.offset + b.nbytes for b in self.buffers), default=0)
        return -(-end // SMEM_ALIGN) * SMEM_ALIGN

    @property
    def dynamic(self) -> bool:
        """Above the 48 KB a kernel may declare statically: allocated at launch."""
        return self.smem_bytes > STATIC_SMEM_LIMIT

    @property
    def body_name(self) -> str:
        return f"{self.entry}_body"

    def body_signature(self) -> str:
        extra = f"const int {BLOCK}, const int {NBLOCKS}, unsigned char* __restrict__ {SMEM}"
        return f"{self.params}, {extra}" if self.params else extra

    def body_text(self) -> str:
        """The statements of the body: buffers carved from the base, then every section."""
        lines = [f"{b.ctype}* {b.name} = reinterpret_cast<{b.ctype}*>({SMEM} + {b.offset});"
                 + (f"  // {comment_text(b.comment)}" if b.comment else "")
                 for b in self.buffers]
        for _, text in self.sections:
            lines.extend(text.rstrip("\n").split("\n") if text.strip() else [])
        return "\n".join(f"{INDENT}{ln}" if ln else "" for ln in lines) + "\n"

    def device_function(self) -> str:
        """`__device__ __forceinline__ void <entry>_body(...)`: the composable form."""
        return (f"__device__ __forceinline__ void {self.body_name}({self.body_signature()}) "
                "{\n" + self.body_text() + "}\n")

    def thread_strided_function(self) -> str:
        """`<entry>_body_t(..., int tk_tx)`: the body with its thread index as a parameter
        (`threadIdx.x` read as `tk_tx`), for a device loop whose persistent block has fewer
        threads than this body: each thread runs it for several thread indices in turn. Only
        for bodies without block barriers or warp shuffles, whose threads are independent."""
        text = self.body_text().replace("threadIdx.x", "tk_tx")
        return (f"__device__ __forceinline__ void {self.body_name}_t({self.body_signature()}, "
                "const int tk_tx) {\n" + text + "}\n")

    def uses_block_barriers(self) -> bool:
        return "__syncthreads" in self.body_text()

    def threads_independent(self) -> bool:
        """No block barrier and no warp collective: its threads never exchange values."""
        text = self.body_text()
        return "__syncthreads" not in text and "__shfl" not in text and "tk_warp" not in text

    def global_function(self) -> str:
        """The `extern "C" __global__` entry that runs the body as its own kernel."""
        bounds = f"{self.threads}, 1" if self.register_tile else f"{self.threads}"
        lines = [f'extern "C" __global__ void __launch_bounds__({bounds})',
                 f"{self.entry}({self.params}) {{"]
        if self.dynamic:
            lines.append(f"{INDENT}TK_DYNAMIC_SMEM({SMEM});")
            base = SMEM
        elif self.smem_bytes:
            lines.append(f"{INDENT}TK_STATIC_SMEM({SMEM}, {self.smem_bytes});")
            base = SMEM
        else:
            base = "nullptr"
        call_args = f"{self.args}, " if self.args else ""
        lines.append(f"{INDENT}{self.body_name}({call_args}(int)blockIdx.x, (int)gridDim.x, "
                     f"{base});")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def source(self) -> str:
        """The kernel's text after the preamble: comments, the body, the entry. Every line
        passes the emitter's check (printable ASCII, comments escaped: no name or expression
        can end a comment or add a line)."""
        head = "".join(f"// {comment_text(c)}\n" for c in self.comments)
        text = head + self.device_function() + "\n" + self.global_function()
        for line in text.splitlines():
            check_line(line)
        return text


@dataclass
class KernelBuilder:
    """Collects a kernel's parts; `build()` freezes them into a `KernelSpec`."""

    entry: str
    params: str
    args: str
    threads: int
    register_tile: bool = False
    comments: list[str] = field(default_factory=list)
    buffers: list[SharedBuffer] = field(default_factory=list)
    sections: list[tuple[str, Emitter]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._names: set[str] = set()
        self.body = self.section("body")

    def section(self, name: str) -> Emitter:
        """A new named section of statements, after the ones before it. All sections share
        one namespace of temporaries."""
        e = Emitter() if not self.sections else self.sections[0][1].sibling()
        self.sections.append((name, e))
        return e

    def shared(self, name: str, ctype: str, count: int, itemsize: int, comment: str = "",
               at: int | None = None) -> str:
        """Carve `ctype name[count]` from the shared-memory base, 16-byte aligned: after every
        buffer so far, or at byte `at` (a buffer placed by liveness, sharing bytes with one
        whose last reader ran before a barrier; the caller guarantees the lives are apart)."""
        if name in self._names:
            raise ValueError(f"shared buffer {name!r} declared twice")
        self._names.add(name)
        if at is not None and at % SMEM_ALIGN:
            raise ValueError(f"shared buffer {name!r} at {at}, not {SMEM_ALIGN}-byte aligned")
        offset = at if at is not None else max(
            (b.offset + -(-b.nbytes // SMEM_ALIGN) * SMEM_ALIGN for b in self.buffers),
            default=0)
        nbytes = -(-count * itemsize // SMEM_ALIGN) * SMEM_ALIGN
        self.buffers.append(SharedBuffer(name, ctype, count, offset, nbytes, comment))
        return name

    def build(self) -> KernelSpec:
        return KernelSpec(self.entry, self.params, self.args, self.threads, self.register_tile,
                          tuple(self.comments), tuple(self.buffers),
                          tuple((n, e.text()) for n, e in self.sections))
