"""Tile programs: the kernel IR between the schedule (tiles) and the code (printers).

- `expr`: scalar expressions with C semantics and a dtype; `functions`: what a program may
  call, as data;
- `nodes`: statements, buffers with a memory scope, thread regions, tile operations
  (`Copy`), kernels; `build`: a structured builder with fresh names and a shared-memory
  allocator; `rewrite`: substitution; `verify`: the checker run after every pipeline;
- `passes`: lowering, each a function kernel -> kernel (layouts, pipelining, vector width,
  thread binding, barriers, serial threads for CPUs), and the pipeline of each target;
- `cstyle`, `cuda`, `cpp`, `emit`: the printers, the only places kernel text is formed.

docs/codegen.md describes the layer with a worked example.
"""
