"""The roll pass: `roll_module(module, profile, top_k) -> Module` with every op tiled.

Each `expr` op gets a `tile` (the contract in docs/roll.md: block, thread, step, grid, blocks,
threads, smem_bytes, regs, estimate, candidates); each `opaque` op a fixed schedule (one thread
per output element, blocks of `OPAQUE_THREADS`) with an estimate from the bytes it moves; each
kernel an `estimate` (for a group of several ops, the group's: intermediates it keeps on chip
cost no DRAM traffic); a group's own tile (`kernels[].tile`) is tk-weld's to choose. The module
records `hardware: {name: <profile name or path>, sha256: <its content hash>}` (later stages
refuse a profile of other figures under that name) and the stage `roll` with its options;
re-rolling
drops what the old tiles decided (`tilekit.ir.stages.INVALIDATES`: group tiles, the rTask
program, kernel launches, generated code), recorded as the stage option `dropped`.

Rolling is a pure function of the op's `Problem` (tilekit.roll.problem) and the profile, so
within one call ops with the same problem share one construction (an imported ResNet-50 has
179 expr ops but 59 distinct problems).

For a `kind: cpu` profile (`profile.is_cpu`) the construction is the CPU's, without search
(`roll_cpu`): each expr op's tile is a `tilekit.ir.payloads.CpuOpTile` (`target: cpu`): the
CPU kernel the shared decision makes of it (`tilekit.schedule.cpu.cpu_shape`: `cpu_gemm` or
`cpu_loops`, with its blocks), the register and cache tiles of the profile
(`cpu_tiles`), and the CPU roofline's estimate (`tilekit.roll.cpu_cost`); an opaque op's
its grid of blocks and the bytes it moves; control ops' regions are rolled the same way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

from tilekit.errors import IRError, TilekitError, UnsupportedError
from tilekit.ir.control import region_module, with_control
from tilekit.ir.dims import is_symbolic
from tilekit.ir.graph import control_records, graph, op_analysis
from tilekit.ir.stages import run_stage
from tilekit.ir.model import OP_KINDS, Kernel, Module, Op, default_kernels
from tilekit.roll.construct import Candidate, roll_problem
from tilekit.ir.payloads import Candidate as TileChoice, OpTile, Tile, read_tile, round_sig
from tilekit.roll.cost import (Estimate, combine_estimates, default_estimate, estimate_bytes,
                               machine)
from tilekit.schedule.mma import PRECISIONS
from tilekit.schedule.shape import OpFacts, Target, analysis_facts, decide, default_shape
from tilekit.roll.problem import Problem, problem_from_analysis, tensor_bytes
from tilekit.ir.payloads import CpuOpTile, is_cpu_tile
from tilekit.roll import cpu_cost
from tilekit.roll.dynamic import by_size, pricing_sizes, roll_symbolic, roll_symbolic_gpu
from tilekit.schedule.cpu import CpuTiles, cpu_shape, cpu_tiles
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid

STAGE = "roll"
#: Threads per block of the fixed schedule given to opaque ops.
OPAQUE_THREADS = 256
#: Registers per thread assumed for an opaque op (its implementation is not ours to size).
OPAQUE_REGS = 32
#: The axis name of an opaque op's flattened output in its tile.
OPAQUE_AXIS = "x"


@dataclass(frozen=True)
class RolledOp:
    """One op's schedule as data, and its estimate for kernel and module totals."""

    tile: dict[str, Any]
    estimate: Estimate


def roll_module(module: Module, profile, top_k: int = 1, hardware: str | None = None,
                precision: str = "fp32") -> Module:
    """Tile every op of `module` for `profile`; keep the `top_k - 1` runners-up per op.

    `precision` "tf32" lets fp32 contractions run on TF32 tensor cores (recorded as the stage
    option `precision`; the default "fp32" keeps them on CUDA cores and is not recorded).
    fp16 and bf16 contractions use tensor cores whenever the profile has them.

    `hardware` is what the module records as its profile (default: `profile.name`); tk-roll
    passes a path there for a profile that is not found by name
    (`tilekit.hw.recorded_profile`). The output has no `codegen` section and no kernel
    `launch`: those belong to the tiles being replaced.

    Raises TilekitError for input that did not come through tk-import (no `import` stage),
    ops of unknown kinds, and expressions that do not analyse.
    """
    if top_k < 1:
        raise TilekitError(f"top_k must be at least 1, got {top_k}", "--top-k")
    if "import" not in module.stage_names():
        raise IRError("the input has no 'import' stage", "stages",
                      "produce it with tk-import, or add '{name: import}' to a hand-written "
                      "document")
    if precision not in PRECISIONS:
        raise TilekitError(f"unknown precision '{precision}'", "--precision",
                           f"known: {', '.join(PRECISIONS)}")
    if precision != "fp32" and getattr(profile, "is_cpu", False):
        raise TilekitError(f"precision '{precision}' selects GPU tensor cores; hardware "
                           f"profile '{profile.name}' is a CPU", "--precision",
                           "drop --precision (a CPU computes float32 contractions in float32)")
    options: dict[str, Any] = {"top_k": top_k}
    if precision != "fp32":
        options["precision"] = precision
    return run_stage(module, STAGE, lambda m: _roll(m, profile, top_k, hardware, precision),
                     options, symbolic=True)


def _roll(module: Module, profile, top_k: int, hardware: str | None,
          precision: str = "fp32") -> Module:
    cache: dict[Problem, list[Candidate]] = {}
    defaults: dict[Problem, Estimate] = {}
    rolled: dict[str, RolledOp] = {}
    records: dict[str, Any] = {}
    dtypes = dtypes_of(module)
    if is_symbolic(module):       # one roll for the range (roll.dynamic)
        ops, estimates = roll_symbolic(module, profile, dtypes, roll_opaque) \
            if profile.is_cpu else roll_symbolic_gpu(module, profile, dtypes, roll_opaque,
                                                     precision)
        rolled = {op.name: RolledOp(op.tile, estimates[op.name]) for op in ops}
        kernels = tuple(roll_kernel(module, k, rolled, profile)
                        for k in (module.kernels or default_kernels(module.ops)))
        return replace(module, ops=ops, kernels=kernels, hardware=hardware or profile.name,
                       hardware_sha256=profile.content_hash)
    tiles = cpu_tiles(profile) if profile.is_cpu else None
    ops = []
    for index, op in enumerate(module.ops):
        where = f"ops[{index}] ({op.name})"
        if op.kind not in OP_KINDS:
            raise UnsupportedError(f"op kind '{op.kind}' is unknown to tk-roll", f"{where}.kind",
                                   f"known kinds: {', '.join(OP_KINDS)}")
        if op.kind == "control":
            result, record = roll_control(module, op, profile, top_k, hardware, precision)
            records[op.name] = record
        elif op.kind == "opaque":
            result = roll_opaque(module, op, profile)
        elif tiles is not None:
            result = roll_cpu(module, index, profile, tiles, dtypes)
        else:
            analysis = op_analysis(module, index)
            problem = problem_from_analysis(analysis, dtypes)
            if problem not in cache:
                cache[problem] = roll_problem(problem, profile, top_k, precision)
                defaults[problem] = default_estimate(problem, machine(profile, problem.dtype,
                                                                      precision))
            result = tile_record(problem, cache[problem], analysis_facts(analysis, dtypes),
                                 Target.of(profile, precision), defaults[problem])
        rolled[op.name] = result
        ops.append(replace(op, tile=result.tile))
    # What the old tiles decided (launch figures, generated code) was dropped by run_stage.
    kernels = tuple(roll_kernel(module, k, rolled, profile)
                    for k in (module.kernels or default_kernels(module.ops)))
    out = replace(module, ops=tuple(ops), kernels=kernels, hardware=hardware or profile.name,
                  hardware_sha256=profile.content_hash)
    return with_control(out, records) if records else out


def settle(module, profile, precision: str = "fp32"):
    """A static module specialised from a symbolic one rolled for a GPU (`tilekit.ir.dims
    .specialise`) with its `by size` tiles decided at its sizes: each such op's tile as a
    static roll of that one tile writes it (grid, kernel, estimate, the default kept where
    the model prices it faster at this size), its kernel's estimate again; the stages
    after tk-roll read what they read of a static roll."""
    from tilekit.roll.construct import candidate, cost_candidates
    from tilekit.roll.rtile import RTile

    if not any(by_size(op.tile) for op in module.ops):
        return module
    dtypes = {name: t.dtype for name, t in module.tensors.items()}
    target = Target.of(profile, precision)
    ops, rolled = [], {}
    for index, op in enumerate(module.ops):
        if not by_size(op.tile):
            ops.append(op)
            rolled[op.name] = RolledOp(op.tile, Estimate.read(
                (op.tile or {}).get("estimate"), f"ops[{index}] ({op.name}).tile.estimate"))
            continue
        analysis = op_analysis(module, index)
        problem = problem_from_analysis(analysis, dtypes)
        t = read_tile(op.tile, problem.spatial, problem.reduction,
                      f"ops[{index}] ({op.name}).tile",
                      unclamped=[a for a, _ in problem.reduction])
        rtile = RTile(t.block, t.thread, t.step)
        m = machine(profile, problem.dtype, precision)
        priced = candidate(rtile, cost_candidates(problem, m, [rtile]), 0)
        made = tile_record(problem, [priced], analysis_facts(analysis, dtypes), target,
                           default_estimate(problem, m))
        ops.append(replace(op, tile=made.tile))
        rolled[op.name] = made
    module = replace(module, ops=tuple(ops))
    kernels = tuple(roll_kernel(module, k, rolled, profile)
                    for k in (module.kernels or default_kernels(module.ops)))
    return replace(module, kernels=kernels)


def roll_control(module: Module, op: Op, profile, top_k: int, hardware: str | None,
                 precision: str) -> tuple[RolledOp, Any]:
    """A control op: every region rolled as a module of its own (the regions' ops get tiles
    and their kernels estimates, nested control ops included); the op itself has no tile,
    and its estimate is one run of each region's kernels (tk-grind prices the iterations)."""
    rec = control_records(module)[op.name]
    regions, parts = [], []
    for region in rec.regions:
        sub = _roll(region_module(module.tensors, region, op.name), profile, top_k, hardware,
                    precision)
        regions.append(replace(region, ops=sub.ops, kernels=sub.kernels, control=sub.control))
        parts.extend(Estimate.read(k.estimate, k.name) for k in sub.kernels)
    est = Estimate(time_us=sum(p.time_us for p in parts), flops=sum(p.flops for p in parts),
                   dram_bytes=sum(p.dram_bytes for p in parts),
                   smem_bytes=sum(p.smem_bytes for p in parts),
                   bound=max(parts, key=lambda p: p.time_us).bound if parts else "launch",
                   waves=max((p.waves for p in parts), default=1),
                   wave_efficiency=min((p.wave_efficiency for p in parts), default=1.0))
    return RolledOp(None, est), rec.with_regions(tuple(regions))


def dtypes_of(module: Module) -> dict[str, str]:
    return {name: t.dtype for name, t in module.tensors.items()}


# -- records ---------------------------------------------------------------------------------

def tile_record(problem: Problem, candidates: list[Candidate], facts: OpFacts,
                target: Target | int, default: Estimate | None = None) -> RolledOp:
    """The `tile` record (tilekit.ir.payloads.OpTile) of the best candidate, the others
    listed under `candidates`, with the kernel the shared shape decision makes of it (what
    the cost model priced, and what codegen will generate).

    The roll never makes an op slower than its default schedule by its own estimate: when
    `default` (the model's estimate of the default kernel, `tilekit.roll.cost.
    default_estimate`) is below the best tile's, the op keeps the default: its kernel is the
    default shape, its estimate the default's, and `rolled_estimate` the best tile's (both
    recorded; the tile stays for reference and for tuning on a device)."""
    best = candidates[0]

    def tile(c: Candidate) -> Tile:
        return Tile(c.tile.block, c.tile.thread, c.tile.step)

    kernel = decide(facts, tile(best), target, best.split)
    estimate, rolled = best.estimate, None
    if (default is not None and kernel.shape != "default"
            and round_sig(default.time_us, 6) < round_sig(best.estimate.time_us, 6)):
        lanes = target.lanes if isinstance(target, Target) else True
        kernel = default_shape(facts, lanes)
        estimate, rolled = default, best.estimate
    record = OpTile(tile(best), tuple(a for a, _ in problem.spatial),
                    tuple(a for a, _ in problem.reduction), best.tile.grid(problem),
                    kernel.smem_bytes if kernel.split is not None else best.smem_bytes,
                    best.regs, estimate,
                    tuple(TileChoice(tile(c), c.estimate) for c in candidates[1:]),
                    kernel.record(), rolled,
                    best.split if kernel.shape == "wgmma" or kernel.split is not None else 1)
    return RolledOp(record.record(), estimate)


def opaque_tile(elements: int, estimate: Estimate) -> dict[str, Any]:
    """The fixed schedule of an opaque op: one thread per element of its first output."""
    blocks = max(1, -(-elements // OPAQUE_THREADS))
    return OpTile(Tile((OPAQUE_THREADS,), (1,), ()), (OPAQUE_AXIS,), (), (blocks,), 0,
                  OPAQUE_REGS, estimate).record()


def roll_opaque(module: Module, op: Op, profile) -> RolledOp:
    spec = op.opaque or {}
    reads = [n for n in dict.fromkeys(spec.get("inputs", ())) if n in module.tensors]
    writes = [n for n in spec.get("outputs", ()) if n in module.tensors]
    elements = module.tensors[writes[0]].size if writes else 1
    if profile.is_cpu:
        # The CPU target runs an opaque op's implementation over the same grid of blocks
        # (tilekit.codegen.opaque): the bytes it moves, over the cores its blocks use.
        blocks = default_grid(elements, DEFAULT_THREADS)
        moved = tensor_bytes(module, reads) + tensor_bytes(module, writes)
        est = cpu_cost.kernel_estimate(profile, 0.0, float(moved), float(moved), blocks)
        tile = CpuOpTile(profile.name, {"shape": "opaque"}, blocks, est)
        return RolledOp(tile.record(), est)
    est = estimate_bytes(profile, tensor_bytes(module, reads), tensor_bytes(module, writes),
                         OPAQUE_THREADS, elements)
    return RolledOp(opaque_tile(elements, est), est)


def roll_cpu(module: Module, index: int, profile, tiles: CpuTiles,
             dtypes: Mapping[str, str]) -> RolledOp:
    """An expr op's CPU tile (module docstring): the shared decision with the profile's
    tiles, priced by the CPU roofline."""
    facts, problem, moved = cpu_cost.op_inputs(module, index, dtypes)
    shape = cpu_shape(facts, tiles)
    est = cpu_cost.op_estimate(profile, problem, shape, moved)
    t = shape.tiles
    tile = CpuOpTile(profile.name, shape.record(), shape.grid, est, (t.mr, t.nr),
                     {"mc": t.mc, "nc": t.nc, "kc": t.kc})
    return RolledOp(tile.record(), est)


def roll_kernel(module: Module, kernel: Kernel, rolled: Mapping[str, RolledOp],
                profile) -> Kernel:
    """A kernel's estimate (its op's, for a singleton); a group of ops also gets the tile of
    its last op, and an estimate in which intermediates that stay inside it cost no DRAM."""
    parts = [rolled[name].estimate for name in kernel.ops]
    if len(kernel.ops) == 1:
        return replace(kernel, estimate=parts[0].record())
    if profile.is_cpu:
        est = cpu_group_estimate(module, kernel.ops,
                                 {name: (rolled[name].tile, rolled[name].estimate)
                                  for name in kernel.ops}, profile)
        return replace(kernel, estimate=est.record())
    saved = 2 * tensor_bytes(module, graph(module).internal_to(kernel.ops))
    est = combine_estimates(profile, parts, saved, rolled[kernel.ops[-1]].estimate)
    return replace(kernel, estimate=est.record())


def cpu_group_estimate(module: Module, ops, members: Mapping[str, tuple[Any, Estimate]],
                       profile) -> Estimate:
    """Ops run as one CPU kernel (`tilekit.roll.cpu_cost.group_estimate`): `members` maps
    each op to its CPU tile and estimate; the kernel has its main op's blocks (the member
    with the most flops), the intermediates read only inside it never go to memory, and a
    tensor several members read comes from memory once (a row chain's passes read the row
    from L1; a chain of elementwise ops loads each point once)."""
    g = graph(module)
    internal = g.internal_to(ops)
    index = module.op_index()
    readers = Counter(t for n in ops for t in dict.fromkeys(g.nodes[index[n]].reads)
                      if t not in internal)
    saved = 2 * tensor_bytes(module, internal) + sum(
        (count - 1) * tensor_bytes(module, [t]) for t, count in readers.items())
    main = max(ops, key=lambda n: members[n][1].flops)
    tile = members[main][0]
    blocks = tile.get("blocks", 1) if is_cpu_tile(tile) else 1
    touched = dict.fromkeys(t for n in ops for t in g.nodes[index[n]].reads
                            + g.nodes[index[n]].writes if t not in internal)
    dtype = module.tensors[g.nodes[index[main]].writes[0]].dtype \
        if g.nodes[index[main]].writes else "float32"
    return cpu_cost.group_estimate(profile, [members[n][1] for n in ops], saved, blocks,
                                   tensor_bytes(module, touched), dtype)


# -- the report (tk-roll --report) -----------------------------------------------------------

REPORT_COLUMNS = ("op", "thread", "block", "step", "blocks", "time_us", "bound")


def _sizes(sizes: Mapping[str, int]) -> str:
    return " ".join(f"{a}{s}" for a, s in sizes.items()) or "-"


def _control_regions(module: Module, name: str):
    rec = control_records(module)[name]
    return [(f"{name}.{rname}", region_module(module.tensors, region, name))
            for rname, region in zip(rec.region_names(), rec.regions)]


def report_rows(module: Module, full: bool = False) -> list[tuple]:
    """One row per op: name, thread tile, block tile, reduction step, grid, time, bound (text
    cells; with `full`, data for the JSON report). A control op is not a kernel of its own:
    its regions' ops are listed instead, named `op.region/name`, so that the rows add up to
    `module_estimate`'s total when every kernel is one op."""
    rows: list[tuple] = []
    _rows(module, "", full, rows)
    return rows


def _rows(module: Module, prefix: str, full: bool, rows: list) -> None:
    for op in module.ops:
        if op.kind == "control":
            for name, region in _control_regions(module, op.name):
                _rows(region, f"{prefix}{name}/", full, rows)
            continue
        t = op.tile or {}
        est = t.get("estimate", {})
        if is_cpu_tile(t):
            rows.append(_cpu_row(prefix + op.name, t, est, full))
            continue
        if full:
            rows.append((prefix + op.name, dict(t.get("thread", {})), dict(t.get("block", {})),
                         dict(t.get("step", {})), t.get("blocks"), est.get("time_us", 0),
                         est.get("bound")))
            continue
        rows.append((prefix + op.name, _sizes(t.get("thread", {})), _sizes(t.get("block", {})),
                     _sizes(t.get("step", {})), str(t.get("blocks", "")),
                     f"{est.get('time_us', 0):g}", str(est.get("bound", ""))))


def _cpu_row(name: str, t: Mapping[str, Any], est: Mapping[str, Any], full: bool) -> tuple:
    """A CPU tile's row: the micro-tile as the thread tile, a block's outputs (`mc x nc` of
    the GEMM view, or rows of the loop nest) as the block, the cache step `kc` as the step."""
    k = t.get("kernel", {})
    micro = t.get("micro")
    if k.get("shape") == "cpu_gemm":
        mc, nc, kc = k.get("blocks", [0, 0, 0])
        block, step = {"mc": mc, "nc": nc}, {"kc": kc}
    elif k.get("shape") == "cpu_loops":
        block, step = {"rows": k.get("rows_per_block")}, {}
    else:
        block, step = {}, {}
    thread = {"mr": micro[0], "nr": micro[1]} if micro else {}
    if full:
        return (name, thread, block, step, t.get("blocks"), est.get("time_us", 0),
                est.get("bound"))
    return (name, _sizes(thread), f"{k.get('shape', '')} {_sizes(block)}".strip(),
            _sizes(step), str(t.get("blocks", "")), f"{est.get('time_us', 0):g}",
            str(est.get("bound", "")))


def report_title(module: Module) -> str:
    """`tk-roll: m on h100: 19 ops, 19 kernels, estimated 82.71 us` (and why the rows do
    not add up to the total when kernels hold several ops)."""
    total = module_estimate(module)
    title = (f"tk-roll: {module.model} on {module.hardware}: {total['ops']} ops, "
             f"{total['kernels']} kernels, estimated {total['time_us']:g} us")
    if total["ops"] != total["kernels"]:
        title += (" (kernels of several ops keep their intermediates on chip: the total is "
                  "the kernels' estimates, below the sum of the ops' rows)")
    if any(op.kind == "control" for op in module.ops):
        title += "; control ops: one run of each region (tk-grind prices the iterations)"
    if is_symbolic(module):
        at = pricing_sizes(module.dims)[0]
        title += (" at " + ", ".join(f"{k}={v}" for k, v in sorted(at.items()))
                  + " (kernels decided by size; each op's tile lists its priced sizes)")
    return title


def report_data(module: Module) -> dict[str, Any]:
    """The report as data (tk-roll --report-format json)."""
    return {"model": module.model, "hardware": module.hardware,
            "estimate": module_estimate(module),
            "ops": [dict(zip(("op", "thread", "block", "step", "blocks", "time_us", "bound"),
                             row)) for row in report_rows(module, full=True)]}


def module_estimate(module: Module) -> dict[str, Any]:
    """Totals over the kernels of a rolled module: kernels run one after another, a control
    op's kernel as one run of each of its regions' kernels (as tk-roll estimates it, and as
    the regions' kernels are counted)."""
    time_us = flops = dram = 0.0
    bounds: dict[str, int] = {}
    kernels = ops = 0
    for m in _flat(module):
        ops += sum(op.kind != "control" for op in m.ops)
        kinds = {op.name: op.kind for op in m.ops}
        for kernel in m.kernels:
            if len(kernel.ops) == 1 and kinds.get(kernel.ops[0]) == "control":
                continue  # counted through its regions
            kernels += 1
            est = kernel.estimate or {}
            time_us += float(est.get("time_us", 0.0))
            flops += float(est.get("flops", 0.0))
            dram += float(est.get("dram_bytes", 0.0))
            bound = est.get("bound")
            if bound:
                bounds[bound] = bounds.get(bound, 0) + 1
    return {"time_us": round_sig(time_us), "flops": round_sig(flops),
            "dram_bytes": round_sig(dram), "kernels": kernels, "ops": ops,
            "bounds": dict(sorted(bounds.items()))}


def _flat(module: Module):
    """The module and every control op's regions as modules, nested ones too."""
    yield module
    for op in module.ops:
        if op.kind == "control":
            for _, region in _control_regions(module, op.name):
                yield from _flat(region)
