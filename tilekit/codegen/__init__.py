"""Code generation: a tile program per kernel group, from tensor expressions and tiles,
printed for CUDA or for CPUs.

    from tilekit.codegen import generate
    result = generate(module, profile)          # CodegenResult: .module (with `codegen`), .kernels
    result = generate(module, target="cpu")     # C++ for CPUs

Modules: `module` (the pass), `plan` (a group's stages, chains, inlining), `values` (tensor
expressions to tile-program expressions: kinds, casts, padding, index maps), the kernel
shapes, each building a tile program (tilekit.tile): `kernel` (shared pieces; `default` and
`tiled`), `staged` (contractions with boxes copied to shared memory), `simt` (float32
GEMMs on CUDA cores: register tiles of 4x4 sub-tiles, 16-byte loads, double-buffered shared
memory), `mma` (tensor-core
contractions, pipelined), `wgmma` (Hopper contractions: TMA, mbarriers, warp roles, wgmma;
split-K), `fused` (multi-stage groups), `flash` (welded attention with online softmax) and
`opaque` (kernels of opaque ops); `cpu` (the CPU target's kernels: packed GEMM panels around
a register-tile micro-kernel, and loop nests in vector lanes), `cpu_rows` (row chains such as
softmax and layer norm as one CPU kernel, rows in L1), `cpu_program` (the CPU unit's program
entry: every kernel in one call and one OpenMP team, tk-ram's CPU plans), `cpu_ram` (the CPU
kernels tk-ram packs); `persistent` (what persistent kernels share),
`program` (tk-ram's persistent programs), `control` (tk-grind's device loops and branches),
`recorded` (recorded kernels checked against a fresh generation before they run),
`parametric` (one build for the sizes of a symbolic module whose code has one structure:
templates, their holes, the units that read sizes at run time), `report`
(each kernel's counters from the tile interpreter), `helpers` (runtime.cuh, runtime_cpu.h
and their hashes), `nvcc` (compile, ptxas resources, cache), `cxx` (the CPU target's build:
the system C++ compiler, cache), `emulate` (the generated CUDA run on the CPU). The schedule
decisions codegen shares with the cost model are in `tilekit.schedule`. Layout of the IR
section and kernel shapes: docs/codegen.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = ["CodegenResult", "CompileReport", "compile_module", "generate", "unit_source"]

if TYPE_CHECKING:
    from tilekit.codegen.module import (CodegenResult, CompileReport, compile_module, generate,
                                        unit_source)


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "CodegenResult": "module",
    "CompileReport": "module",
    "compile_module": "module",
    "generate": "module",
    "unit_source": "module",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
