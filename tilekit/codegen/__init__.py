"""CUDA code generation: one kernel per kernel group, from tensor expressions and tiles.

    from tilekit.codegen import generate
    result = generate(module, profile)        # CodegenResult: .module (with `codegen`), .kernels

Modules: `module` (the pass), `plan` (a group's stages, chains, inlining), `builder` (the
kernel builder: parameters, block index, shared-memory base, one allocator), the kernel
shapes `kernel` (shared pieces; `default` and `tiled`), `staged` (shared-memory
contractions), `mma` (tensor-core contractions), `fused` (multi-stage groups), `flash`
(welded attention with online softmax) and `opaque` (CUDA implementations of opaque ops);
`cexpr` (expressions to C), `emitter` (the indented buffer, lines checked), `persistent`
(what persistent kernels share), `program` (tk-ram's persistent programs), `control`
(tk-grind's device loops and branches), `recorded` (recorded kernels checked against a fresh
generation before they run), `helpers` (runtime.cuh, the device helpers, and its hash),
`nvcc` (compile, ptxas resources, cache), `emulate` (the generated kernels run on the CPU).
The schedule decisions codegen shares with the cost model are in `tilekit.schedule`.
Layout of the IR section and kernel shapes: docs/codegen.md.
"""

from tilekit.codegen.module import (CodegenResult, CompileReport, compile_module, generate,
                                    unit_source)

__all__ = ["CodegenResult", "CompileReport", "compile_module", "generate", "unit_source"]
