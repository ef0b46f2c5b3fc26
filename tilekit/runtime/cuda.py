"""The CUDA runtime: run a module's generated kernels on an NVIDIA GPU with CuPy.

    from tilekit.runtime import cuda
    outputs = cuda.run_module(module, inputs, weights)         # what tk-run --device cuda calls
    timing = cuda.time_kernels(module, inputs, weights, runs=100)  # CUDA-event timing

`prepare(module)` builds a `CudaProgram` once per module object: it takes the kernels from the
IR's `codegen` section (running `tilekit.codegen.generate` first when the section is absent,
with the default schedules), refuses what changes the result and that it cannot run (an
unknown op kind: the same rule as the CPU executor; control ops run through
`tilekit.runtime.cuda_control`: host-driven, or device loops launched cooperatively), checks that
runtime.cuh is the one they were generated against and that each kernel's shared memory fits
the device, builds them as one translation unit for the device's arch (nvcc to a cubin through
the compile cache when nvcc is on PATH and not newer than the driver, else NVRTC through
`cupy.RawModule`), and allocates one device buffer per tensor that a kernel reads or writes. A
run uploads the inputs (weights are uploaded on the first run and again only when a different
array object is passed), launches every kernel in order on the current stream, synchronises
and downloads the outputs.

Without CuPy, or without a visible GPU, every entry point raises `TilekitError` saying so
(tk-run exits 2). Exercised by tests/gpu/ and `make gpu-check` where a GPU is present (run
on an H100: README, "On a GPU"); skipped elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tilekit.errors import TilekitError
from tilekit.expr.ops import numpy_dtype
from tilekit.ir.control import all_tensors, walk
from tilekit.ir.graph import control_records, per_module
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import CodegenSection, KernelRecord
from tilekit.runtime.bench import Timing

#: Runs of every kernel that `tk-run --device cuda --report` averages (after one warm-up).
PROFILE_RUNS = 5

_PROGRAMS: dict[int, "CudaProgram"] = {}


def require_cupy():
    """CuPy and a visible device, or a TilekitError that says which is missing."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken CUDA install
        raise TilekitError(f"CuPy is not importable ({type(exc).__name__}: {exc})",
                           "--device cuda",
                           "install it (pip install 'tilekit[cuda]', i.e. cupy-cuda13x; "
                           "cupy-cuda12x for a CUDA 12 driver) on a machine with an NVIDIA "
                           "GPU, or use --device cpu") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver
        raise TilekitError(f"no CUDA device is visible ({type(exc).__name__}: {exc})",
                           "--device cuda", "run on a machine with an NVIDIA GPU and driver, "
                           "or use --device cpu") from None
    if count == 0:
        raise TilekitError("no CUDA device is visible", "--device cuda", "use --device cpu")
    return cupy


def device_arch() -> str:
    cupy = require_cupy()
    cc = cupy.cuda.Device().compute_capability  # "90"
    return f"sm_{cc}"


def build_arch(section: CodegenSection, arch: str) -> str:
    """The target `section`'s unit is built for on a device of `arch`: the arch-specific one
    its kernels were generated for when it is this device's (sm_90a: wgmma), else `arch`."""
    return section.arch if section.arch == f"{arch}a" else arch


def device_description() -> str:
    """`NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, CUDA runtime 12040, driver 12040)`."""
    cupy = require_cupy()
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return (f"{name} (sm_{dev.compute_capability}, {props['multiProcessorCount']} SMs, "
            f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
            f"driver {cupy.cuda.runtime.driverGetVersion()})")


@dataclass(frozen=True)
class Launch:
    entry: str
    function: Any                   # cupy RawKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple[str, ...]
    counters: Any = None            # a tk-ram program's progress counters (zeroed per launch)
    #: Its blocks wait on each other (a tk-ram program, a tk-grind device loop): launched with
    #: cuLaunchCooperativeKernel, after `check_coresident` found its grid resident at once.
    cooperative: bool = False
    #: TMA descriptors (sm_90), encoded once for the program's buffers, passed by value last
    tensor_maps: tuple = ()

    def __call__(self, buffers: Mapping[str, Any]) -> None:
        args = tuple(buffers[t] for t in self.args)
        if self.counters is not None:
            self.counters.fill(0)   # a memset on the same stream, before the kernel
            args += (self.counters,)
        args += self.tensor_maps
        # A cooperative function comes from the module loaded for cooperative launches, which
        # CuPy launches with cuLaunchCooperativeKernel (it would shrink a 1-D cooperative grid
        # that does not fit, with a warning; check_coresident refused that grid before, so the
        # grid launched is the planned one)
        self.function(self.grid, self.block, args, shared_mem=self.smem_bytes)


def coresident_launch(record: KernelRecord, index: int, cooperative_function: Any, cupy,
                      occupancy) -> Launch:
    """The launch of a kernel whose blocks wait on each other (a tk-ram program, a tk-grind
    device loop): its grid checked against the driver's occupancy when the module is loaded
    (`check_coresident`: refused, never launched, when it is larger than what is resident at
    once), its function from the module loaded for cooperative launches and launched with
    cuLaunchCooperativeKernel (grid barriers need it; the driver also refuses a grid that is
    not co-resident instead of letting it hang), its counters allocated."""
    from tilekit.runtime.occupancy import check_coresident

    grid = record.grid[0] * record.grid[1] * record.grid[2]
    check_coresident(record.entry, grid, record.threads, record.smem_bytes,
                     cooperative_function, occupancy, f"codegen.kernels[{index}]")
    counters = cupy.zeros(record.counters, dtype=np.uint32) if record.counters else None
    return Launch(record.entry, cooperative_function, record.grid, record.block,
                  record.smem_bytes, record.args, counters, cooperative=True)


def program_sequence(module: Module, section: CodegenSection, launches, by_group):
    """The kernel groups of a tk-ram program in the order its segments run (a persistent
    segment as its first operator, launching the segment's program kernel) and the launches
    of each."""
    from tilekit.ir.program import read_program

    kernels = module.kernels or default_kernels(module.ops)
    entry = {k.entry: launch for k, launch in zip(section.kernels, launches)}
    sequence, out = [], dict(by_group)
    for seg in read_program(module).segments:
        first = kernels[seg.operators[0]]
        sequence.append(first)
        if seg.kind == "persistent":
            out[first.name] = [entry[e] for e in (first.launch or {}).get("entries", ())]
    return sequence, out


class CudaProgram:
    """A module's kernels loaded on the current device, with its buffers."""

    def __init__(self, module: Module, occupancy=None, unit=None, profile=None):
        """`occupancy` answers for the device (tilekit.runtime.occupancy; the driver's by
        default, a fake in tests). `unit`: the build to load instead of the module's own
        kernels, a template whose sizes are parameters with this module's size tables
        (tilekit.codegen.parametric.Unit; a symbolic module's size, tilekit.runtime.family):
        the module's codegen section, generated by this process, then gives the launches.
        `profile`: the GPU profile a module without kernels was rolled for; its kernels are
        generated for it (the tensor-core instructions it offers) and this device's arch, as
        `tk-codegen --hw PROFILE --arch ARCH` generates them."""
        from tilekit.runtime.cpu import check_runnable

        check_runnable(module, "the CUDA runtime", control=True)
        cupy = require_cupy()
        self.cupy = cupy
        if not module.codegen:
            from tilekit.codegen.module import generate
            module = generate(module, profile,
                              device_arch() if profile is not None else None).module
        elif unit is None:  # recorded sources are input: compiled if tk-codegen would write them
            from tilekit.codegen.recorded import check_recorded_kernels
            check_recorded_kernels(module)
        section = CodegenSection.read(module.codegen)
        self._check_helpers(section)
        self._check_shared_memory(section)
        self.outputs = tuple(module.outputs)
        self.arch = device_arch()
        self.unit = unit
        self.raw = self._load(section)
        self.buffers: dict[str, Any] = {}
        self.bfloat16 = frozenset(n for n, t in module.tensors.items() if t.dtype == "bfloat16")
        self.launches: list[Launch] = []
        written: set[str] = set()
        from tilekit.codegen.emulate import with_scratch
        declared = with_scratch(module, section.kernels)    # split-K partial sums too
        for k in section.kernels:
            self._allocate(k.args, declared)
            raw = self._cooperative(section) if k.coresident else self.raw
            fn = raw.get_function(k.entry)
            if k.smem_bytes > 48 * 1024:
                # Dynamic shared memory above 48 KB needs an explicit opt-in per kernel.
                fn.max_dynamic_shared_size_bytes = k.smem_bytes
            if k.coresident:
                if occupancy is None:
                    from tilekit.runtime.occupancy import CupyOccupancy
                    occupancy = CupyOccupancy(cupy)
                self.launches.append(coresident_launch(k, len(self.launches), fn, cupy,
                                                       occupancy))
            else:
                maps = tuple(kernel_tensor_map(m, self.buffers[m["tensor"]].data.ptr)
                             for m in k.tensor_maps)
                # (a split-K staged kernel's per-tile counters: zeroed before each launch)
                counters = cupy.zeros(k.counters, dtype=np.uint32) if k.counters else None
                self.launches.append(Launch(k.entry, fn, k.grid, k.block, k.smem_bytes,
                                            k.args, counters, tensor_maps=maps))
            written.update(k.writes)
        self._control(module, section, written, declared)
        self.inputs = tuple(module.inputs)
        self.weight_names = tuple(n for n, t in module.tensors.items() if t.role == "weight")
        self.passthrough = tuple(o for o in module.outputs if o not in written)
        for o in self.passthrough:
            if o not in module.inputs and o not in self.weight_names:
                raise TilekitError(f"output '{o}' is written by no kernel", "codegen.kernels",
                                   "re-run tk-codegen on this IR")
        # The weight arrays last uploaded, held (not their id(): ids are reused after a free)
        # so that a run with the same array objects skips the upload.
        self._uploaded: dict[str, np.ndarray] = {}

    def _allocate(self, names, declared) -> None:
        """A device buffer for each of `names` that has none yet (declared shape and dtype)."""
        for name in names:
            if name not in self.buffers:
                t = declared[name]
                self.buffers[name] = self.cupy.empty(tuple(t.shape), dtype=_np_dtype(t.dtype))

    def _control(self, module: Module, section: CodegenSection, written: set[str],
                 declared) -> None:
        """Steps when the module has control ops (tilekit.runtime.cuda_control): buffers for
        what the host moves, the outputs a run-time count trims; None: a flat launch list."""
        self.steps = None
        self.counts = {"launches": 0, "syncs": 0}
        self.trims: dict[str, str] = {}
        self.overruns: tuple = ()
        records = control_records(module)
        if not records:
            return
        from tilekit.runtime.control import kept_counts, overrun_checks
        from tilekit.runtime.cuda_control import build_steps

        for _, rec, _ in walk(module):
            names = [*rec.explicit_reads(), *rec.writes()]
            for region in rec.regions:
                names += [*region.inputs, *region.outputs]
            self._allocate(names, declared)
        for rec in records.values():
            written.update(rec.writes())
        by_group: dict[str, list[Launch]] = {}
        for k, launch in zip(section.kernels, self.launches):
            by_group.setdefault(k.group, []).append(launch)
        sequence = None
        if module.program is not None:  # segments in the program's order, one step each
            sequence, by_group = program_sequence(module, section, self.launches, by_group)
        self.steps = build_steps(module, section.extra.get("control", {}), by_group, sequence)
        self.trims = kept_counts(module)
        self.overruns = overrun_checks(module)

    @staticmethod
    def _check_helpers(section: CodegenSection) -> None:
        from tilekit.codegen.helpers import helpers_sha256

        want = section.helpers.get("sha256")
        have = helpers_sha256()
        if want and want != have:
            raise TilekitError("the kernels were generated against another runtime.cuh "
                               f"(sha256 {want[:12]}..., this tilekit has {have[:12]}...)",
                               "codegen.helpers", "re-run tk-codegen with this tilekit")

    def _check_shared_memory(self, section: CodegenSection) -> None:
        """Each kernel's dynamic shared memory within the device's opt-in maximum per block."""
        limit = _max_shared_memory_per_block(self.cupy)
        if limit is None:
            return
        for index, k in enumerate(section.kernels):
            if k.smem_bytes > limit:
                raise TilekitError(
                    f"kernel {k.entry} needs {k.smem_bytes} bytes of shared memory per "
                    f"block; this device allows at most {limit}",
                    f"codegen.kernels[{index}].smem_bytes",
                    "re-run tk-codegen with this device's hardware profile (--hw), or smaller "
                    "tiles")

    def _cooperative(self, section: CodegenSection):
        """The same unit loaded once more, for cooperative launches (tk-ram programs)."""
        if getattr(self, "_coop", None) is None:
            self._coop = self._load(section, cooperative=True)
        return self._coop

    def _load(self, section: CodegenSection, cooperative: bool = False):
        cupy = self.cupy
        from tilekit.codegen.helpers import HELPERS
        from tilekit.codegen.nvcc import compile_unit

        source = unit_source(section.kernels) if self.unit is None else self.unit.source
        nvcc = usable_nvcc(cupy)
        arch = build_arch(section, self.arch)
        if arch != self.arch and nvcc is None:
            raise TilekitError(f"the kernels need the {arch} target (wgmma), which this "
                               "runtime builds with nvcc; none that the driver can load was "
                               "found", "--device cuda",
                               "install a CUDA toolkit no newer than the driver (or set "
                               "TILEKIT_NVCC), or generate for sm_90 without wgmma: "
                               "tk-codegen --arch sm_80")
        extra = {"enable_cooperative_groups": True} if cooperative else {}
        if nvcc is not None:
            raw = cupy.RawModule(path=str(compile_unit(source, arch).cubin), **extra)
        else:  # NVRTC: the same unit; runtime.cuh is found through the include path.
            raw = cupy.RawModule(code=source, backend="nvrtc",
                                 options=("-std=c++17", f"-I{HELPERS.parent}"), **extra)
        self._set_sizes(raw)
        return raw

    def _set_sizes(self, raw) -> None:
        """A template's size tables (`unit`), at this program's sizes, in the loaded
        module's constant memory (each load has its own: set once, read by every run)."""
        if self.unit is None:
            return
        from tilekit.tile.cstyle import SIZE_TABLES

        for (name, dtype), values in zip(SIZE_TABLES, (self.unit.ints, self.unit.floats)):
            if values:
                table = np.asarray(values, dtype=dtype)
                raw.get_global(name).copy_from_host(table.ctypes.data, table.nbytes)

    # -- running ---------------------------------------------------------------------------
    def upload(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> None:
        for name in self.weight_names:
            if name in self.buffers and self._uploaded.get(name) is not weights[name]:
                self._set(name, weights[name])
                self._uploaded[name] = weights[name]
        for name in self.inputs:
            if name in self.buffers:
                self._set(name, inputs[name])

    def _set(self, name: str, array: np.ndarray) -> None:
        # ascontiguousarray makes a 0-d array 1-d; the buffer has the tensor's own shape.
        buffer = self.buffers[name]
        array = np.ascontiguousarray(array)
        if name in self.bfloat16:
            array = array.astype(numpy_dtype("bfloat16"), copy=False).view(np.uint16)
        buffer.set(array.reshape(buffer.shape))

    def _get(self, name: str) -> np.ndarray:
        array = self.buffers[name].get()
        return array.view(numpy_dtype("bfloat16")) if name in self.bfloat16 else array

    def launch_all(self) -> None:
        if self.steps is not None:
            from tilekit.runtime.cuda_control import run_steps

            run_steps(self, self.steps)
            return
        for launch in self.launches:
            launch(self.buffers)

    def download(self, inputs, weights) -> dict[str, np.ndarray]:
        from tilekit.runtime.control import check_overruns

        check_overruns(self.overruns, self._count)
        out = {}
        for name in self.outputs:
            if name in self.passthrough:
                out[name] = np.asarray(inputs[name] if name in inputs else weights[name])
            else:
                out[name] = self._get(name)
        for name, count in self.trims.items():
            out[name] = out[name][:self._count(count)]
        return out

    def _count(self, name: str) -> int:
        """A loop's count tensor after the run, read back (the trims, the overruns)."""
        return int(self.buffers[name].get().reshape(-1)[0])

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor a kernel reads or writes, as the last run left it on the device."""
        return {name: self._get(name) for name in self.buffers}

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
        self.upload(inputs, weights)
        self.launch_all()
        self.cupy.cuda.get_current_stream().synchronize()
        return self.download(inputs, weights)

    def profile(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                runs: int = PROFILE_RUNS) -> tuple[dict[str, np.ndarray], list[tuple[str, float]]]:
        """Each kernel timed with CUDA events over `runs` runs after one warm-up: (outputs,
        [(kernel entry, mean seconds per run)] in launch order; an entry launched twice per run
        counts both launches)."""
        self.upload(inputs, weights)
        timing = self.time(runs, warmup=1, per_kernel=True)
        outputs = self.download(inputs, weights)
        return outputs, [(entry, sum(times) / runs) for entry, times in timing.per_kernel.items()]

    def time(self, runs: int, warmup: int = 1, per_kernel: bool = False,
             graph: bool = False) -> "KernelTiming":
        """Kernel time only (inputs already uploaded): CUDA events around each run of every
        kernel, `warmup` untimed runs first. With `per_kernel`, also per entry (each kernel
        launched from the host). With `graph` (whole runs), each run is the run replayed as
        one CUDA graph (`graph_run`): the kernels without the host's launches between them."""
        cupy = self.cupy
        if per_kernel and self.steps is not None:
            raise TilekitError("per-kernel timing runs every kernel once in order; a module "
                               "with control flow runs some per iteration", "--report",
                               "time the whole run (tk-run --bench) instead")
        if graph:
            stream, captured = self.graph_run()
            run = lambda: captured.launch(stream)  # noqa: E731 - one replay is one run
        else:
            stream, run = cupy.cuda.get_current_stream(), self.launch_all
        for _ in range(warmup):
            run()
        stream.synchronize()
        totals: list[float] = []
        each: dict[str, list[float]] = {ln.entry: [] for ln in self.launches}
        for _ in range(runs):
            if per_kernel:
                events = [cupy.cuda.Event() for _ in range(len(self.launches) + 1)]
                events[0].record()
                for k, launch in enumerate(self.launches):
                    launch(self.buffers)
                    events[k + 1].record()
                events[-1].synchronize()
                for k, launch in enumerate(self.launches):
                    each[launch.entry].append(
                        cupy.cuda.get_elapsed_time(events[k], events[k + 1]) * 1e-3)
                totals.append(cupy.cuda.get_elapsed_time(events[0], events[-1]) * 1e-3)
            else:
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                run()
                stop.record(stream)
                stop.synchronize()
                totals.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
        return KernelTiming(tuple(totals), warmup, GRAPH_METHOD if graph else LAUNCHED_METHOD,
                            per_kernel={k: tuple(v) for k, v in each.items()} if per_kernel
                            else {})

    def graph_run(self):
        """The run captured once as a CUDA graph on a stream of its own: (stream, graph).
        Every launch of `launch_all` (and a program's counter resets) becomes a node with
        its buffers' addresses, so uploads into the same buffers are what a replay reads.
        A module whose host steps read values between kernels (control flow on the host)
        has no such graph, and a capture the driver refuses is an error naming it."""
        cupy = self.cupy
        if self.steps is not None:
            raise TilekitError("this module runs control flow on the host (it reads values "
                               "between kernels), so a run is not one CUDA graph", "--graph",
                               "time it without --graph, or place its loops on the device "
                               "(tk-grind) first")
        self.launch_all()                  # every function loaded before the capture
        cupy.cuda.get_current_stream().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        errors = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)
        try:
            with stream:
                stream.begin_capture()
                try:
                    self.launch_all()
                except errors:
                    _end_capture(stream, errors)  # out of capture; the launch's error stands
                    raise
                graph = stream.end_capture()
                graph.upload(stream)
        except errors as exc:
            raise TilekitError(f"the run could not be captured as a CUDA graph: {exc}",
                               "--graph", "time it without --graph") from None
        return stream, graph


def _end_capture(stream, errors) -> None:
    """Leave stream capture after a failed launch (the partial graph is dropped)."""
    try:
        stream.end_capture()
    except errors:
        pass


#: What a kernel timing measured (Timing.method): the kernels launched from the host, or
#: each run replayed as one CUDA graph.
LAUNCHED_METHOD = "CUDA events, kernels only"
GRAPH_METHOD = "CUDA events, kernels only, each run replayed as one CUDA graph"


@dataclass(frozen=True)
class KernelTiming(Timing):
    """Seconds per run of all kernels (CUDA events), and per kernel when asked."""

    method: str = LAUNCHED_METHOD
    per_kernel: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def unit_source(kernels: "tuple[KernelRecord, ...]") -> str:
    """The kernels recorded in a `codegen` section as one translation unit, the way
    `tilekit.codegen.module.unit_source` builds it: one preamble (with `TK_USE_HALF` when any
    kernel needs it), then every kernel's body.

    A record's source is its own preamble (a pure function of the record:
    `tilekit.tile.cuda.file_preamble`) followed by its body; a source that does not start with
    that preamble was not written by this tilekit and is refused.
    """
    from tilekit.codegen.kernel import shape_defines
    from tilekit.tile.cuda import file_preamble, unit_text

    bodies = []
    for k in kernels:
        head = file_preamble(k.name, k.ops, k.shape, k.uses_half, shape_defines(k.shape))
        if not k.source.startswith(head):
            raise TilekitError(f"the source of kernel {k.entry} does not start with the "
                               "preamble tk-codegen writes", "codegen.kernels",
                               "re-run tk-codegen with this tilekit")
        bodies.append(k.source[len(head):])
    return unit_text(bodies, [shape_defines(k.shape) for k in kernels],
                     any(k.uses_half for k in kernels))


def _major(version: str) -> int | None:
    head = version.split(".")[0]
    return int(head) if head.isdigit() else None


def usable_nvcc(cupy) -> str | None:
    """nvcc when it is on PATH and no newer than the driver (a cubin from a newer toolkit
    does not load); None means NVRTC, which CuPy matches to its own CUDA runtime."""
    from tilekit.codegen.nvcc import find_nvcc, nvcc_version

    nvcc = find_nvcc()
    if nvcc is None:
        return None
    toolkit = _major(nvcc_version(nvcc))
    driver = cupy.cuda.runtime.driverGetVersion() // 1000   # 12040 -> 12
    return nvcc if toolkit is not None and toolkit <= driver else None


# -- TMA descriptors (sm_90) ----------------------------------------------------------------
#: CUtensorMapDataType (cuda.h) of each tensor dtype a descriptor may describe.
TMA_DATA_TYPE = {"uint8": 0, "int8": 0, "float16": 6, "float32": 7, "float64": 8,
                 "bfloat16": 9, "int32": 3, "int64": 5}
#: CUtensorMapSwizzle of each swizzle width in bytes.
TMA_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
#: CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
#: CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (elements outside the tensor read as zeros).
TMA_INTERLEAVE_NONE, TMA_L2_PROMOTION_256B, TMA_OOB_FILL_ZEROS = 0, 3, 0
#: sizeof(CUtensorMap) and its alignment (cuda.h: alignas(128) since CUDA 13).
TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN = 128, 128


@dataclass(frozen=True)
class TensorMapArgs:
    """The arguments of `cuTensorMapEncodeTiled` for one descriptor of a kernel record
    (besides the output and the global address): a pure function of the record."""

    data_type: int
    rank: int
    dims: tuple[int, ...]            # innermost first
    strides: tuple[int, ...]         # bytes, of dimensions 1..rank-1
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


def tensor_map_args(record: Mapping[str, Any]) -> TensorMapArgs:
    """What the driver is asked to encode for a `tensor_maps` entry of a kernel record, with
    the driver's rules checked first (each a TilekitError naming the entry): at most 5
    dimensions, strides multiples of 16 bytes, box sizes 1..256, a swizzled box row no wider
    than the swizzle."""
    where = f"tensor map {record.get('name')}"
    dims, strides, box = (tuple(int(x) for x in record[k]) for k in ("dims", "strides", "box"))
    dtype, swizzle = str(record["dtype"]), int(record["swizzle"])
    if dtype not in TMA_DATA_TYPE or swizzle not in TMA_SWIZZLE:
        raise TilekitError(f"{where}: no TMA encoding for {dtype} with a {swizzle}-byte "
                           "swizzle", "codegen.kernels", "re-run tk-codegen")
    if not (1 <= len(dims) <= 5 and len(box) == len(dims) and len(strides) == len(dims) - 1):
        raise TilekitError(f"{where}: {len(dims)} dimensions, {len(box)} box sizes, "
                           f"{len(strides)} strides", "codegen.kernels", "re-run tk-codegen")
    item = int(np.dtype(_np_dtype(dtype)).itemsize)
    if any(s % 16 or s >= 2 ** 40 for s in strides) or any(not 1 <= b <= 256 for b in box) \
            or (swizzle and box[0] * item > swizzle):
        raise TilekitError(f"{where}: strides {strides} or box {box} break TMA's rules",
                           "codegen.kernels", "re-run tk-codegen")
    return TensorMapArgs(TMA_DATA_TYPE[dtype], len(dims), dims, strides, box,
                         (1,) * len(dims), TMA_INTERLEAVE_NONE, TMA_SWIZZLE[swizzle],
                         TMA_L2_PROMOTION_256B, TMA_OOB_FILL_ZEROS)


def encode_tensor_map(args: TensorMapArgs, address: int, driver=None) -> bytes:
    """The 128 bytes of a CUtensorMap for the tensor at device `address`, from the driver's
    `cuTensorMapEncodeTiled` (libcuda through ctypes; `driver` for a stand-in)."""
    import ctypes

    if driver is None:
        try:
            driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise TilekitError(f"the CUDA driver library is not loadable ({exc})",
                               "--device cuda", "install the NVIDIA driver") from None
    encode = driver.cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    raw = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN))()
    start = (-ctypes.addressof(raw)) % TENSOR_MAP_ALIGN   # alignas(128) in CUDA 13
    out = ctypes.byref(raw, start)
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = encode(out, ctypes.c_int(args.data_type), u32(args.rank), ctypes.c_void_p(address),
                (u64 * args.rank)(*args.dims), (u64 * max(args.rank - 1, 1))(*args.strides),
                (u32 * args.rank)(*args.box), (u32 * args.rank)(*args.element_strides),
                ctypes.c_int(args.interleave), ctypes.c_int(args.swizzle),
                ctypes.c_int(args.l2_promotion), ctypes.c_int(args.oob_fill))
    if rc != 0:
        raise TilekitError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for {args}",
                           "--device cuda", "a kernel's tensor map does not suit this device")
    return bytes(raw[start:start + TENSOR_MAP_BYTES])


#: A CUtensorMap as a kernel argument: CuPy passes a NumPy structured scalar by value.
TENSOR_MAP_ARG = np.dtype([("bytes", np.uint8, (TENSOR_MAP_BYTES,))])


def kernel_tensor_map(record: Mapping[str, Any], address: int, driver=None):
    """A kernel record's descriptor for the buffer at `address`, as the argument CuPy passes."""
    raw = encode_tensor_map(tensor_map_args(record), address, driver)
    return np.frombuffer(raw, dtype=TENSOR_MAP_ARG)[0]


def _max_shared_memory_per_block(cupy) -> int | None:
    """The device's opt-in maximum of shared memory per block (bytes), if CuPy reports it."""
    # Device.attributes keys are the cudaDevAttr names without the prefix.
    value = cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin")
    return int(value) if value else None


def _np_dtype(dtype: str):
    """The CuPy buffer type of a tensor: CuPy has no bfloat16, so a bfloat16 tensor lives in a
    uint16 buffer of its bit patterns (the kernels read them as __nv_bfloat16)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def prepare(module: Module, profile=None) -> CudaProgram:
    """Load `module` on the current device (cached per module object); `profile`: the GPU
    profile it was rolled for, when it has no kernels yet (CudaProgram)."""
    return per_module(_PROGRAMS, module, lambda m: CudaProgram(m, profile=profile))


def run_module(module: Module, inputs: Mapping[str, np.ndarray],
               weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `module`'s generated kernels on the GPU; outputs in `module.outputs` order."""
    return prepare(module).run(inputs, weights)


def time_kernels(module: Module, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], runs: int, warmup: int = 1,
                 per_kernel: bool = False, graph: bool = False) -> KernelTiming:
    """CUDA-event timing of `runs` runs of every kernel (after one upload and `warmup` runs);
    `graph`: each run replayed as one CUDA graph (CudaProgram.graph_run)."""
    program = prepare(module)
    program.upload(inputs, weights)
    return program.time(runs, warmup, per_kernel, graph)
