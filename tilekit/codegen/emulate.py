"""Run a module's generated CUDA on the CPU: the evidence that kernels compute the right thing
on a machine without a GPU.

`emulate(module, inputs, weights)` takes the kernel sources recorded in the IR's `codegen`
section, compiles them as host C++ with `host_emul.h` (g++, C++17), launches every kernel with
its recorded grid and block (blocks one after another, the threads of a block as fibers with
real barriers that also catch divergent ones; a `coresident` kernel with all its blocks at
once, so progress counters and grid barriers run as written, and deadlocks and a missing
fence before a counter signal abort) and returns the module's outputs. Index maps, padding, boundary tiles,
shared-memory staging, barriers between stages and lane-group reductions all run as written;
what it cannot show is timing, coalescing, bank conflicts, or races that only the hardware's
scheduling exposes. Half types are host_types.h's (IEEE rounding); tensor-core intrinsics,
TMA copies, mbarriers and wgmma follow their documented layouts (host_emul.h); a kernel's TMA
descriptors are built by the harness from its record (`tensor_maps`) in the emulation's own
encoding, and split-K scratch buffers (`scratch`) are allocated like tensors.

Binaries are cached next to nvcc's (`$TILEKIT_CACHE/emul/<key>`). host_emul.h (with the
standard headers it includes) is compiled once per cache as a GCC precompiled header
(`emul/headers-<key>/host_emul.h.gch`), and the emulation's runtime (host_emul.cpp: the
scheduler, the tensor-core, TMA and wgmma emulation, the harness's file I/O) once as an
object (`emul/runtime-<key>/host_emul.o`) linked into every binary: together they were most
of a small module's compile time. Their flags
are the same for every module, so the module's dynamic shared-memory size is a `#define` at
the top of the generated main.cpp, not a `-D` flag. A fiber switch costs about a microsecond:
keep fixtures small (thousands of blocks with many barriers take seconds).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from tilekit.codegen.cxx import (cache_key, compile_in, compiler_version, find_cxx,
                                 precompiled_headers)
from tilekit.codegen.kernel import tvar
from tilekit.tile.cstyle import SIZE_TABLES
from tilekit.tile.cuda import CudaPrinter
from tilekit.ir.payloads import CodegenSection
from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.control import all_tensors
from tilekit.ir.model import Module

HERE = Path(__file__).resolve().parent
CXX_FLAGS = ("-std=c++17", "-O1", "-w")
#: The runtime object's: built once, so optimised further (it runs every fiber switch and
#: every emulated wgmma element).
RUNTIME_FLAGS = ("-std=c++17", "-O2", "-w")


def harness_source(module: Module, unit=None) -> str:
    """A C++ main() that loads tensors from `<dir>/<name>.bin`, launches every kernel in
    order and writes every tensor a kernel wrote back to `<dir>/<name>.out`; with `unit` (a
    template whose sizes are parameters), its size tables are set first."""
    kernels = CodegenSection.read(module.codegen).kernels
    declared = with_scratch(module, kernels)
    tensors: list[str] = []
    for k in kernels:
        for t in k.args:
            if t not in tensors:
                tensors.append(t)
    lines = ["// argv: data folder, then optionally a kernel index and block ids: launch only",
             "// those blocks of that kernel (sampled emulation of large modules).",
             "int main(int argc, char** argv) {",
             "  const char* dir = argc > 1 ? argv[1] : \".\";",
             "  const int only = argc > 2 ? std::atoi(argv[2]) : -1;",
             "  std::vector<unsigned> ids;",
             "  for (int a = 3; a < argc; ++a) ids.push_back((unsigned)std::atoi(argv[a]));"]
    if unit is not None:
        for (name, _), values in zip(SIZE_TABLES, (unit.ints, unit.floats)):
            lines += [f"  {name}[{i}] = {v!r};" for i, v in enumerate(values)]
    for t in tensors:
        tensor = declared[t]
        nbytes = tensor.size * np.dtype(_np_dtype(tensor.dtype)).itemsize
        lines.append(f"  auto buf_{_c(t)} = tk_emul::load(dir, \"{t}\", {nbytes});")
    for index, k in enumerate(kernels):
        ptrs = []
        for t in k.args:
            ctype = CudaPrinter.TYPES[declared[t].dtype]
            ptrs.append(f"reinterpret_cast<{ctype}*>(buf_{_c(t)}.data())")
        grid = k.grid[0] * k.grid[1] * k.grid[2]
        if k.counters:  # a program's progress counters: a zeroed workspace per launch
            lines.append(f"  std::vector<unsigned> counters_{index}({k.counters}, 0u);")
            ptrs.append(f"counters_{index}.data()")
        for j, m in enumerate(k.tensor_maps):  # TMA descriptors, in the emulation's encoding
            lines.extend(_tensor_map_lines(f"tm_{index}_{j}", m, declared))
            ptrs.append(f"tm_{index}_{j}")
        call = f"[&] {{ {k.entry}({', '.join(ptrs)}); }}"
        if k.coresident:  # its blocks wait on each other: all resident, never sampled
            lines.append(f"  if (only < 0) tk_emul::launch_concurrent({grid}, {k.threads}, "
                         f"{call});")
        else:
            lines.append(f"  if (only < 0 || only == {index}) tk_emul::launch({grid}, "
                         f"{k.threads}, {call}, only < 0 ? nullptr : ids.data(), "
                         f"(unsigned)ids.size());")
    written = [t for k in kernels for t in k.writes]
    for t in dict.fromkeys(written):
        writers = [i for i, k in enumerate(kernels) if t in k.writes]
        cond = " || ".join(f"only == {i}" for i in writers)
        lines.append(f"  if (only < 0 || {cond}) tk_emul::save(dir, \"{t}\", buf_{_c(t)});")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _c(name: str) -> str:
    return tvar(name)[2:]


def with_scratch(module: Module, kernels) -> dict:
    """The module's tensors and the kernels' scratch buffers (split-K partial sums: float32,
    no tensor of the module), by name."""
    from tilekit.ir.model import Tensor
    out = dict(all_tensors(module))
    for k in kernels:
        out.update({name: Tensor((int(n),), "float32") for name, n in k.scratch.items()})
    return out


def _tensor_map_lines(var: str, m, declared) -> list[str]:
    """`var`: the emulation's tensor map of a kernel record's descriptor (host_emul.h's
    tk_emul_tensor_map over the tensor's buffer; strides[0] is the element size)."""
    item = np.dtype(_np_dtype(declared[m["tensor"]].dtype)).itemsize
    def arr(ctype, name, values):
        return f"  const {ctype} {var}_{name}[] = {{{', '.join(str(int(v)) for v in values)}}};"
    return [arr("unsigned long long", "dims", m["dims"]),
            arr("unsigned long long", "strides", [item, *m["strides"]]),
            arr("unsigned", "box", m["box"]),
            f"  const tk_tensor_map {var} = tk_emul_tensor_map(buf_{_c(m['tensor'])}.data(), "
            f"{item}, {len(m['dims'])}, {var}_dims, {var}_strides, {var}_box, "
            f"{int(m['swizzle'])});"]


def _np_dtype(dtype: str) -> str:
    """The NumPy type of a tensor's bytes (bfloat16 travels as its 16-bit pattern)."""
    return {"bool": "bool", "bfloat16": "uint16"}.get(dtype, dtype)


def _to_bytes(array, dtype: str) -> np.ndarray:
    """A tensor's values as the bytes a kernel reads (bfloat16: rounded to nearest even)."""
    if dtype != "bfloat16":
        return np.ascontiguousarray(np.asarray(array, dtype=_np_dtype(dtype)))
    bits = np.ascontiguousarray(np.asarray(array, dtype=np.float32)).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _from_bytes(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "bfloat16":
        return raw
    return (raw.astype(np.uint32) << 16).view(np.float32)


def unit_from_ir(module: Module) -> str:
    return "\n".join(k.source for k in CodegenSection.read(module.codegen).kernels)


def main_source(module: Module, harness: str) -> str:
    """main.cpp: the largest dynamic shared memory of the kernels (each block's buffer in
    the emulation, host_emul.h's TK_DYNAMIC_SMEM), the kernels' unit, then the harness."""
    kernels = CodegenSection.read(module.codegen).kernels
    dyn = max([k.smem_bytes for k in kernels] + [16])
    return f"#define TK_EMUL_DYNAMIC_SMEM {dyn}\n#include \"unit.cu\"\n" + harness


def _headers() -> dict[str, str]:
    return {name: (HERE / name).read_text() for name in ("host_emul.h", "host_types.h")}


def runtime_object(cxx: str, version: str | None = None,
                   headers: dict[str, str] | None = None) -> Path:
    """host_emul.cpp (the scheduler, the tensor-core, TMA and wgmma emulation, the harness's
    file I/O) compiled once per cache, by its text, the headers' (read when not given), the
    compiler (`version`: its `--version` line, asked for when not given) and the flags:
    `emul/runtime-<key>/host_emul.o`, linked into every emulation binary."""
    from tilekit.codegen.nvcc import building, cache_dir

    headers = _headers() if headers is None else headers
    source = (HERE / "host_emul.cpp").read_text()
    version = compiler_version(cxx) if version is None else version
    key = "runtime-" + cache_key(source, *headers.values(), cxx, version, " ".join(RUNTIME_FLAGS))
    final = cache_dir() / "emul" / key
    obj = final / "host_emul.o"
    if obj.exists():
        return obj
    with building(final, key) as work:
        for name, text in {**headers, "host_emul.cpp": source}.items():
            (work / name).write_text(text)
        compile_in(work, key, [cxx, *RUNTIME_FLAGS, "-c", "host_emul.cpp", "-o", "host_emul.o"],
                   "host compile of the emulation runtime failed")
    return obj


def host_program(source: Path, exe: Path, *flags: str) -> None:
    """A host program of its own (a test's) against the emulation: `source` compiled with
    host_emul.h included first and `flags`, linked with the runtime object, into `exe`."""
    cxx = find_cxx()
    subprocess.run([cxx, *CXX_FLAGS, *flags, "-include", str(HERE / "host_emul.h"), "-I",
                    str(HERE), "-x", "c++", str(source), "-x", "none",
                    str(runtime_object(cxx)), "-o", str(exe)],
                   check=True, capture_output=True, text=True)


def build(module: Module, unit=None) -> Path:
    """Compile the emulation binary for `module` (cached by content); with `unit`
    (tilekit.codegen.parametric.Unit: a template whose sizes are parameters, and the
    module's size tables), its source instead of the module's own kernels."""
    from tilekit.codegen.nvcc import building, cache_dir

    if not module.codegen:
        raise TilekitError("the module has no codegen section", "codegen", "run tk-codegen")
    cxx = find_cxx()
    if cxx is None:
        raise UnsupportedError("no C++ compiler (g++ or clang++) for the CPU emulation")
    main = main_source(module, harness_source(module, unit))
    unit = unit_from_ir(module) if unit is None else unit.source
    headers = _headers()
    helpers = (HERE / "runtime.cuh").read_text()
    version = compiler_version(cxx)
    runtime = runtime_object(cxx, version, headers)
    key = cache_key(unit, main, *headers.values(), helpers, cxx, version, " ".join(CXX_FLAGS),
                    runtime.parent.name)
    final = cache_dir() / "emul" / key
    exe = final / "emulate"
    if exe.exists():
        return exe
    included = precompiled_headers(cxx, version, headers, "host_emul.h", CXX_FLAGS, "emul")
    with building(final, key) as work:
        (work / "unit.cu").write_text(unit)
        (work / "runtime.cuh").write_text(helpers)
        if included is None:
            for name, text in headers.items():
                (work / name).write_text(text)
        (work / "main.cpp").write_text(main)
        header = str(included / "host_emul.h") if included else "host_emul.h"
        compile_in(work, key, [cxx, *CXX_FLAGS, "-include", header, "-I", ".", "-x", "c++",
                               "main.cpp", "-x", "none", str(runtime), "-o", "emulate"],
                   "host compile of the emulation failed")
    return exe


#: Schedules (TK_EMUL_SEED) a module with co-resident kernels runs under: blocks that wait on
#: each other may race, and a race shows as results that differ between schedules.
CONCURRENT_SEEDS = (1, 2, 3)


def emulate(module: Module, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray], timeout: float = 600,
            unit=None) -> dict[str, np.ndarray]:
    """Outputs of `module` computed by its generated kernels run on the CPU (`unit`: a
    template's build and the module's size tables, run instead of its own kernels: `build`).
    A module with a co-resident kernel runs under each of `CONCURRENT_SEEDS`; results that
    differ between them are a race between blocks and raise."""
    for name, entry in (module.codegen or {}).get("control", {}).items():
        if entry.get("run") != "device":
            raise UnsupportedError(f"control op '{name}' runs on the host: the emulation "
                                   "runs device loops and branches only", "codegen.control",
                                   "place it on the device with tk-grind, or check it with "
                                   "tk-run --device cpu")
    exe = build(module, unit)
    values = {**weights, **inputs}
    kernels = CodegenSection.read(module.codegen).kernels
    seeds = CONCURRENT_SEEDS if any(k.coresident for k in kernels) else (None,)
    declared = with_scratch(module, kernels)
    with tempfile.TemporaryDirectory(prefix="tk-emul-") as tmp:
        for t in sorted({t for k in kernels for t in k.args}):
            tensor = declared[t]
            if t in values:
                arr = _to_bytes(values[t], tensor.dtype)
            else:  # written by a kernel: garbage-fill so that unwritten elements show up
                arr = _to_bytes(np.full(tensor.shape, np.nan if tensor.dtype.startswith(
                    ("float", "bfloat")) else 0), tensor.dtype)
            arr.tofile(os.path.join(tmp, f"{t}.bin"))
        first: dict[str, np.ndarray] | None = None
        for seed in seeds:
            out = _run_once(module, exe, tmp, values, seed, timeout)
            if first is None:
                first = out
                continue
            for name, value in out.items():
                if not np.array_equal(value, first[name], equal_nan=value.dtype.kind == "f"):
                    raise RuntimeError(f"emulation: output '{name}' differs between schedules "
                                       f"(TK_EMUL_SEED {seeds[0]} and {seed}): blocks race")
        return first


def _run_once(module: Module, exe: Path, tmp: str, values: Mapping[str, np.ndarray],
              seed: int | None, timeout: float) -> dict[str, np.ndarray]:
    env = dict(os.environ)
    if seed is not None:
        env["TK_EMUL_SEED"] = str(seed)
    proc = subprocess.run([str(exe), tmp], capture_output=True, text=True, timeout=timeout,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"emulation failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = {}
    for name in module.outputs:
        tensor = module.tensors[name]
        path = os.path.join(tmp, f"{name}.out")
        if os.path.exists(path):
            out[name] = _from_bytes(np.fromfile(path, dtype=_np_dtype(tensor.dtype)),
                                    tensor.dtype).reshape(tensor.shape)
        else:
            out[name] = np.asarray(values[name])
    return out


def emulate_blocks(module: Module, kernel: int, values: Mapping[str, np.ndarray],
                   blocks: list[int], timeout: float = 600) -> dict[str, np.ndarray]:
    """Run only `blocks` of kernel number `kernel` (of `codegen.kernels`) on `values` (every
    tensor it reads); returns the tensors it writes, NaN (or 0 for integers) where the sampled
    blocks wrote nothing. For checking large modules kernel by kernel against reference
    intermediates without emulating every block. A split-K kernel runs every slice of the
    sampled blocks' output tiles (the last of a tile adds them up); its scratch buffers are
    no output."""
    exe = build(module)
    records = CodegenSection.read(module.codegen).kernels
    record = records[kernel]
    if record.coresident:
        raise ValueError(f"kernel {record.entry} needs all its blocks resident at once; "
                         "emulate the whole module instead of sampled blocks")
    grid = record.grid[0] * record.grid[1] * record.grid[2]
    if any(not 0 <= b < grid for b in blocks):
        raise ValueError(f"block ids must be in [0, {grid})")
    if record.scratch and record.counters:   # block b: tile b % tiles, slice b // tiles
        tiles = record.counters
        blocks = sorted({b % tiles + s * tiles for b in blocks for s in range(grid // tiles)})
    declared = with_scratch(module, records)
    with tempfile.TemporaryDirectory(prefix="tk-emul-") as tmp:
        for t in record.args:
            if t in record.scratch:
                continue              # the harness zero-fills a buffer with no file
            tensor = declared[t]
            if t in record.writes:
                arr = _to_bytes(np.full(tensor.shape, np.nan if tensor.dtype.startswith(
                    ("float", "bfloat")) else 0), tensor.dtype)
            else:
                arr = _to_bytes(values[t], tensor.dtype)
            arr.tofile(os.path.join(tmp, f"{t}.bin"))
        proc = subprocess.run([str(exe), tmp, str(kernel), *map(str, blocks)],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"emulation failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        out = {}
        for t in record.writes:
            if t in record.scratch:
                continue
            tensor = declared[t]
            raw = np.fromfile(os.path.join(tmp, f"{t}.out"), dtype=_np_dtype(tensor.dtype))
            out[t] = _from_bytes(raw, tensor.dtype).reshape(tensor.shape)
        return out
