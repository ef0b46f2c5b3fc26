"""CUDA code generation: one kernel per kernel group, from tensor expressions and tiles.

    from tilekit.codegen import generate
    result = generate(module, profile)        # CodegenResult: .module (with `codegen`), .kernels

Modules: `plan` (stages, chains, inlining), `kernel` (shared pieces; `default` and `tiled`
shapes), `staged` (shared-memory contractions), `fused` (multi-stage groups), `opaque` (CUDA
implementations of opaque ops), `cexpr` (expressions to C), `emitter` (the indented buffer),
`schedule` (tiles and defaults), `nvcc` (compile and ptxas resources), `emulate` (run the
generated kernels on the CPU), `module` (the pass). runtime.cuh holds the device helpers.
Layout of the IR section and kernel shapes: docs/codegen.md.
"""

from tilekit.codegen.module import (CodegenResult, CompileReport, compile_module, generate,
                                    unit_source)

__all__ = ["CodegenResult", "CompileReport", "compile_module", "generate", "unit_source"]
