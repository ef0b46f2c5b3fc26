"""tk-hw probe --cpu: measurements -> a kind: cpu profile (pure, with written measurements), the
system's topology read from a sysfs tree built here, the working sets, and -- where g++ is
present -- the kernels compiled, run in quick mode and turned into a profile that validates.

No figure of this machine is asserted beyond plausibility (a wide range and positive): the
suite runs anywhere. How steady the probe is, is measured by tests/bench/test_probe_cpu_bench.py.
"""

from __future__ import annotations

import copy
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilekit.cli.tk_hw import main
from tilekit.errors import ProfileError, TilekitError
from tilekit.hw import ENV_VAR
from tilekit.hw.probe_cpu_profile import probed_cpu_profile
from tilekit.hw.probe_profile import measurement_rows
from tilekit.hw.registry import read_profile_text
from tilekit.runtime import probe, probe_cpu
from tilekit.runtime.probe_cpu import (CacheInfo, CpuDevice, core_of, figure_of, parse_cpu_list,
                                       parse_size, read_caches, working_sets)

#: One worker runs this file (an xdist group): the quick probe of this CPU (probed_here)
#: runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("hw-probe-cpu")

REPO = Path(__file__).resolve().parents[2]
KiB, MiB, GiB = 2**10, 2**20, 2**30
WHEN = "AMD EPYC 7763 64-Core Processor, 2026-01-05"
HAS_CXX = shutil.which("g++") is not None


def result(value: float, what: str, samples: int = 12) -> dict:
    return {"value": value, "what": what, "samples": samples, "low": value * 0.9,
            "high": value * 1.02}


def _reads(level: str, core: float, every: float) -> dict:
    return {f"read_{level}_core": result(core, f"{level} streaming, one thread"),
            f"read_{level}_all": result(every, f"{level} streaming, all threads")}


#: Milan-like measurements of a 4-core slice (written by hand, not measured).
MILAN = {
    "kind": "cpu", "device": "AMD EPYC 7763 64-Core Processor", "vendor": "amd",
    "arch": "znver3", "date": "2026-01-05", "plan": "full", "notes": [],
    "topology": {
        "cores": 4, "threads": 8, "isa": "avx2", "vector_bytes": 32,
        "memory_bytes": 64 * GiB, "how": "sysfs topology of the 8 CPUs this process may use",
        "caches": [
            {"level": "l1", "capacity": 32 * KiB, "line": 64, "shared_by": 1,
             "how": "sysfs cpu0/cache/index0"},
            {"level": "l2", "capacity": 512 * KiB, "line": 64, "shared_by": 1,
             "how": "sysfs cpu0/cache/index2"},
            {"level": "l3", "capacity": 32 * MiB, "line": 64, "shared_by": 4,
             "how": "sysfs cpu0/cache/index3"}]},
    "results": {
        "clock": result(3.2e9, "dependent adds"),
        "fma_core": result(101.9e9, "FMA chains, one thread"),
        "fma_all": result(390.0e9, "FMA chains, 4 threads"),
        "fma_per_clock": result(31.84, "FMA and adds in turn"),
        "fork_join": result(1.2e-6, "empty parallel regions"),
        **_reads("l1", 190e9, 760e9), **_reads("l2", 95e9, 370e9),
        **_reads("l3", 60e9, 200e9), **_reads("dram", 22e9, 40e9)},
}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def probed(measurements=MILAN):
    text = probed_cpu_profile(measurements)
    return text, read_profile_text(text, "<probed>")


# -- measurements -> profile ----------------------------------------------------------------------

def test_the_probed_profile_validates_and_says_what_it_is():
    text, p = probed()
    assert (p.name, p.kind, p.arch, p.vendor) == ("znver3-probed", "cpu", "znver3", "amd")
    assert (p.cores, p.hardware_threads, p.isa, p.simd_bytes, p.vector_registers) == (
        4, 8, "avx2", 32, 16)
    assert text.startswith("# Probed by tk-hw probe --cpu on AMD EPYC 7763")
    assert p.description == "AMD EPYC 7763 64-Core Processor, probed by tk-hw probe --cpu on " \
                            "2026-01-05"


def test_every_figure_is_measured_or_derived():
    _, p = probed()
    for path, source in p.sources.items():
        assert source.startswith(("measured: tk-hw probe --cpu (", "derived: ")), path
        if source.startswith("measured:"):
            assert source.endswith(f") on {WHEN}"), path
    assert p.source("memory[l3].capacity") == (
        f"measured: tk-hw probe --cpu (sysfs cpu0/cache/index3/size) on {WHEN}")
    assert p.source("simd.registers") == ("derived: avx2 has 16 architectural vector registers "
                                          "(ymm0-ymm15)")


def test_measured_figures_are_the_measurements():
    _, p = probed()
    assert p.clock_hz == 3.2e9
    assert (p.cache("l1").capacity_bytes, p.cache("l3").shared_by) == (32 * KiB, 4)
    assert p.cache("l2").bandwidth == 95e9 and p.cache("l2").bandwidth_all == 370e9
    assert p.cache("dram").bandwidth == 22e9 and p.dram_bandwidth == 40e9
    assert p.cache("dram").capacity_bytes == 64 * GiB
    assert p.cache("dram").line_bytes == 64
    assert p.fork_join_s == pytest.approx(1.2e-6)


def test_fma_units_and_the_compute_fraction_are_derived():
    _, p = probed()
    # 31.84 FLOP per clock / (8 lanes x 2 FLOP) = 1.99 -> 2 units
    assert p.fma_units == 2
    assert p.source("simd.fma_units").startswith(
        "derived: 31.84 FP32 FLOP per clock on one core / (8 lanes x 2 FLOP) = 1.99, rounded; "
        "FLOP per clock measured: tk-hw probe --cpu (FMA and adds in turn) on ")
    peak = 4 * 2 * 8 * 2 * 3.2e9
    assert p.peak_flops("fp32") == pytest.approx(peak)
    assert p.achievable.compute == round(390.0e9 / peak, 3)
    assert p.achievable.dram == p.achievable.smem == 1.0
    assert p.source("achievable.dram").startswith("derived: the bandwidths above are "
                                                  "streaming-read rates")


def test_notes_give_the_repetitions():
    text, _ = probed()
    assert 'note: "12 repetitions from full plan, 19.8 GB/s to 22.44 GB/s"' in text


def test_an_all_core_rate_below_one_core_is_written_as_one_cores():
    m = copy.deepcopy(MILAN)
    m["results"]["read_dram_all"]["value"] = 18e9  # a busy machine
    text, p = probed(m)
    assert p.cache("dram").bandwidth_all == p.cache("dram").bandwidth == 22e9
    assert "all cores measured 18 GB/s, less than one core: written as one core's" in text


def test_a_disturbed_ratio_gets_a_note_and_fma_units_stay_whole():
    m = copy.deepcopy(MILAN)
    m["results"]["fma_per_clock"]["value"] = 46.2  # / 16 = 2.89
    text, p = probed(m)
    assert p.fma_units == 3
    assert "not near a whole number: the clock or the FMA rate was disturbed" in text
    m["results"]["fma_per_clock"]["value"] = 5.0  # / 16 = 0.31
    _, p = probed(m)
    assert p.fma_units == 1 and "rounded up to 1" in p.source("simd.fma_units")
    m["results"]["fma_all"]["value"] = 1e15
    text, p = probed(m)
    assert p.achievable.compute == 1.0 and "capped at 1" in p.source("achievable.compute")


def test_deterministic_and_ordered():
    assert probed_cpu_profile(MILAN) == probed_cpu_profile(copy.deepcopy(MILAN))
    text, _ = probed()
    keys = [m.group(1) for m in re.finditer(r"^(\w+):", text, re.M)]
    assert keys == ["schema", "name", "vendor", "arch", "kind", "description", "cores", "simd",
                    "memory", "compute", "parallel", "achievable"]


def test_without_an_l3_the_profile_has_none():
    m = copy.deepcopy(MILAN)
    m["topology"]["caches"] = m["topology"]["caches"][:2]
    _, p = probed(m)
    assert [lv.name for lv in p.caches] == ["l1", "l2"]
    assert p.l2_bytes == 4 * 512 * KiB  # the GPU-shaped L2 is the outermost cache


@pytest.mark.parametrize("change, message", [
    (lambda m: m["results"].pop("clock"), "measurements lack 'clock'"),
    (lambda m: m.pop("arch"), "measurements lack 'arch'"),
    (lambda m: m["topology"].update(isa="altivec"), "unknown SIMD ISA 'altivec'"),
    (lambda m: m["topology"].update(threads=6), "the probed profile does not validate: "
                                                "<probed>:13: cores.threads: 6 hardware threads"),
])
def test_bad_measurements_are_one_error(change, message):
    m = copy.deepcopy(MILAN)
    change(m)
    with pytest.raises(ProfileError, match=re.escape(message)):
        probed_cpu_profile(m)


def test_measurement_rows_for_a_cpu():
    rows = measurement_rows(MILAN)
    assert rows[0] == ("clock (dependent adds)", "3.2 GHz", "dependent adds")
    assert ("DRAM read, all cores", "40 GB/s", "dram streaming, all threads") in rows
    assert ("FP32 FLOP per clock, one core", "31.84", "FMA and adds in turn") in rows
    assert len(rows) == 13


# -- what the system says ---------------------------------------------------------------------------

def _cpu(root: Path, cpu: int, package: int, core: int, caches: dict[int, tuple]) -> None:
    topo = root / f"cpu{cpu}" / "topology"
    topo.mkdir(parents=True)
    (topo / "physical_package_id").write_text(f"{package}\n")
    (topo / "core_id").write_text(f"{core}\n")
    for index, (level, kind, size, shared) in caches.items():
        d = root / f"cpu{cpu}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size),
                            ("coherency_line_size", 64), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")


@pytest.fixture
def sysfs(tmp_path):
    """8 CPUs, 4 cores with 2 threads each (siblings n and n+4), L3 shared by cores 0-1 and
    2-3."""
    root = tmp_path / "cpu"
    for cpu in range(8):
        core = cpu % 4
        siblings = f"{core},{core + 4}"
        l3 = "0-1,4-5" if core < 2 else "2-3,6-7"
        _cpu(root, cpu, 0, core, {0: (1, "Data", "48K", siblings),
                                  1: (1, "Instruction", "32K", siblings),
                                  2: (2, "Unified", "1280K", siblings),
                                  3: (3, "Unified", "16384K", l3)})
    return root


def test_topology_and_caches_from_sysfs(sysfs):
    cpus = set(range(8))
    cores = core_of(cpus, sysfs)
    assert len(set(cores.values())) == 4
    caches = read_caches(cpus, cores, sysfs)
    assert [(c.level, c.capacity, c.line, c.shared_by) for c in caches] == [
        (1, 48 * KiB, 64, 1), (2, 1280 * KiB, 64, 1), (3, 16 * MiB, 64, 2)]
    assert caches[2].how == "sysfs cpu0/cache/index3"


def test_an_affinity_mask_counts_only_its_cores(sysfs):
    cpus = {0, 1, 2}  # cores 0, 1 (one L3) and 2 (the other)
    cores = core_of(cpus, sysfs)
    caches = read_caches(cpus, cores, sysfs)
    assert len(set(cores.values())) == 3
    assert caches[2].shared_by == 1  # gcd(2, 1): it must divide the 3 cores


def test_sizes_and_cpu_lists():
    assert parse_size("32K") == 32 * KiB and parse_size("1M") == MiB and parse_size("64") == 64
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    with pytest.raises(ValueError):
        parse_size("lots")


def _device(cores=4, l3_shared=4) -> CpuDevice:
    return CpuDevice(name="x", vendor="amd", arch="znver3", cores=cores, threads=cores,
                     caches=(CacheInfo(1, 32 * KiB, 64, 1, ""), CacheInfo(2, 512 * KiB, 64, 1, ""),
                             CacheInfo(3, 32 * MiB, 64, l3_shared, "")),
                     memory_bytes=64 * GiB, isa="avx2", vector_bytes=32, binary=Path("/none"))


def test_working_sets_sit_inside_each_level_and_past_the_one_before():
    dev = _device()
    one, every = working_sets(dev, 1), working_sets(dev, 4)
    assert one["l1"] == every["l1"] == 16 * KiB
    assert 32 * KiB * 2 < one["l2"] < 512 * KiB
    assert 512 * KiB * 2 < one["l3"] < 32 * MiB
    assert 512 * KiB < every["l3"] < 8 * MiB  # each core's share of the shared L3 is 8 MiB
    assert one["dram"] == 4 * (4 * (32 + 512) * KiB + 32 * MiB)
    assert every["dram"] * 4 == one["dram"]
    assert all(size % 4096 == 0 for size in [*one.values(), *every.values()])


def test_figure_of_is_the_median_of_the_fastest_quarter():
    # 8 repetitions, 5 slowed by other work: the fastest quarter is the machine's rate
    assert figure_of([1.0, 2.0, 3.0, 4.0, 5.0, 9.8, 10.0, 10.2]) == 10.1
    assert figure_of([5.0]) == 5.0 and figure_of([1.0, 3.0]) == 3.0
    # one lucky repetition among 16 does not set the figure
    assert figure_of([8.0] * 4 + [10.0] * 11 + [50.0]) == 10.0


def test_a_ratio_and_an_inverse_series():
    from tilekit.runtime.probe_cpu import Series
    ratio = Series("x", [32.0] * 8, [2.0] * 8).result()
    assert ratio["value"] == 16.0 and ratio["samples"] == 8
    fork = Series("y", [1e6, 5e5, 1e6, 1e6], inverse=True).result()
    assert fork["value"] == 1e-6 and fork["high"] == 2e-6


# -- the command ------------------------------------------------------------------------------------

def test_without_a_gpu_the_cli_probes_the_cpu(monkeypatch, tmp_path):
    def no_gpu():
        raise TilekitError("no CUDA device is visible", "probe")

    monkeypatch.setattr(probe, "open_device", no_gpu)
    monkeypatch.setattr(probe_cpu, "open_cpu", lambda: _device())
    monkeypatch.setattr(probe_cpu, "measure_cpu", lambda dev, quick, progress: MILAN)
    assert probe.measure(_device()) is MILAN  # the CPU is measured through probe.measure
    out = tmp_path / "znver3-probed.yaml"
    got = CliRunner().invoke(main, ["probe", "-o", str(out)])
    assert got.exit_code == 0, got.stderr
    assert got.stderr.startswith("tk-hw: warning: no GPU to probe (no CUDA device is visible): "
                                 "probing the CPU")
    assert "FP32 FMA, all cores" in got.stderr
    assert out.read_text() == probed_cpu_profile(MILAN)
    # --cpu needs no GPU at all, and says nothing about one
    got = CliRunner().invoke(main, ["probe", "--cpu", "--quiet"])
    assert got.exit_code == 0 and got.stderr == ""
    assert got.stdout == probed_cpu_profile(MILAN)


@pytest.mark.parametrize("args, message", [
    (["--cpu", "--base", "h100"], "--cpu: --cpu with --base; the CPU probe starts from no base"),
    (["--cpu", "--gpu"], "--cpu: --cpu with --gpu"),
    (["--base", "milan"], "'milan' is a amd cpu profile; tk-hw probe measures NVIDIA GPUs: "
                          "start from an NVIDIA profile (--base h100); tk-hw probe --cpu "
                          "measures a CPU"),
])
def test_flag_errors_are_one_line(args, message, monkeypatch):
    monkeypatch.chdir(REPO)
    got = CliRunner().invoke(main, ["probe", *args])
    assert got.exit_code == 2
    assert len(got.stderr.splitlines()) == 1
    assert message in got.stderr, got.stderr


# -- the kernels, compiled and run (needs g++ with OpenMP) ----------------------------------------

needs_cxx = pytest.mark.skipif(not HAS_CXX, reason="no g++ to build the CPU probe")


@pytest.fixture(scope="session")
def probed_here(tmp_path_factory):
    """`tk-hw probe --cpu --quick` run once through the command line."""
    out = tmp_path_factory.mktemp("probe") / "here.yaml"
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "tk-hw"), "probe", "--cpu",
                           "--quick", "-o", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    return proc, out


@needs_cxx
def test_quick_probe_of_this_cpu_writes_a_profile_that_validates(probed_here):
    proc, out = probed_here
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    p = read_profile_text(out.read_text(), str(out))
    assert p.kind == "cpu" and p.name.endswith("-probed")
    # plausible, positive figures; nothing about this particular machine
    assert 1 <= p.cores <= p.hardware_threads and p.isa in ("avx2", "avx512", "neon", "sve")
    assert 0.3e9 < p.clock_hz < 8e9
    assert 1 <= p.fma_units <= 8
    for level in p.cpu.levels:
        assert 1e8 < level.bandwidth <= level.bandwidth_all < 1e14, level.name
        assert level.capacity_bytes > 0 and level.line_bytes in (32, 64, 128, 256)
    assert 1e-8 < p.fork_join_s < 1e-2
    assert 0 < p.achievable.compute <= 1
    for path, source in p.sources.items():
        assert source.startswith(("measured: tk-hw probe --cpu (", "derived: ")), path
    assert "L1 read, one core" in proc.stderr  # the table of what was measured


@needs_cxx
def test_the_device_reports_what_the_compiler_targets():
    cache_dir = Path(os.environ["TILEKIT_CACHE"])  # the run's (tests/conftest.py)
    dev = probe_cpu.open_cpu()
    assert dev.isa in ("avx2", "avx512", "neon", "sve") and dev.vector_bytes in (16, 32, 64) or \
        dev.isa == "sve"
    assert dev.binary.exists() and dev.binary.parent.parent == cache_dir / "probe-cpu"
    assert [c.level for c in dev.caches][:2] == [1, 2]
    assert dev.describe().startswith(dev.name)


X86_TARGETS = {"x86-64-v3": ("ymm", 16), "skylake-avx512": ("zmm", 32)}


@needs_cxx
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
@pytest.mark.parametrize("march", X86_TARGETS)
def test_the_loops_survive_the_compiler(march, tmp_path):
    """The assembly of each x86 target: the FMA chains are vfmadd on the ISA's registers (2 x
    the chains per trip), the streaming read folds 8 loads per trip, the clock's chain is 100
    register adds (a .rept block, for the assembler to unroll)."""
    asm = tmp_path / "probe.s"
    flags = [f for f in probe_cpu.FLAGS if not f.startswith("-march")]
    subprocess.run(["g++", *flags, f"-march={march}", "-S", "-o", str(asm),
                    str(probe_cpu.SOURCE)], check=True, capture_output=True, text=True)
    text = asm.read_text()
    register, chains = X86_TARGETS[march]
    chains = 12 if register == "ymm" else 20
    assert len(re.findall(rf"vfmadd\w+ps\s+%{register}\d+, %{register}\d+, %{register}\d+",
                          text)) >= 2 * chains
    assert len(re.findall(rf"vpxor\w*\s+-?\w*\(%\w+\), %{register}\d+, %{register}\d+",
                          text)) >= 8
    assert re.search(r"\.rept 100\s+addq\s+%\w+, %\w+\s+\.endr", text)


CROSS = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")


@pytest.mark.skipif(CROSS is None or QEMU is None,
                    reason="needs aarch64-linux-gnu-g++ and qemu-aarch64 (the Arm kernels)")
@pytest.mark.parametrize("march, cpu, isa, width", [
    ("armv8.4-a+sve", "max", "sve", 64),     # qemu's SVE vectors are 64 bytes by default
    ("armv8-a", "max,sve=off", "neon", 16),
])
def test_the_arm_kernels_build_and_run_under_qemu(march, cpu, isa, width, tmp_path):
    """The AArch64 paths (SVE intrinsics, NEON intrinsics, the add chain in A64 assembly) on an
    x86 machine: cross-compiled and run by qemu-user. Functional only: qemu's timings mean
    nothing."""
    binary = tmp_path / "probe_cpu"
    flags = [f for f in probe_cpu.FLAGS if not f.startswith("-march")]
    subprocess.run([CROSS, *flags, f"-march={march}", "-o", str(binary), str(probe_cpu.SOURCE)],
                   check=True, capture_output=True, text=True)
    env = dict(os.environ, QEMU_LD_PREFIX="/usr/aarch64-linux-gnu", QEMU_CPU=cpu,
               OMP_NUM_THREADS="2")

    def run(*args: str) -> str:
        proc = subprocess.run([QEMU, str(binary), *args], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert run("info").splitlines()[:2] == [f"isa {isa}", f"vector_bytes {width}"]
    timed = ("0.002", "2", "1")
    assert f"flop_per_unit {2 * 20 * (width // 4) * 2 * 2}" in \
        run("fma", *timed)
    assert run("read", "65536", *timed).count("rep ") == 2
    assert run("clock", *timed).count("rep ") == 2
    assert run("fmaclock", *timed).count("pair ") == 2
    assert "regions_per_unit 1" in run("forkjoin", *timed)
