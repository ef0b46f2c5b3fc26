"""kind: cpu profiles: the shipped ones against their published figures, the derived peaks, the
accessors the CPU side reads, the GPU-shaped view and its rules, variants.

The catalogue of broken CPU files (one located line each) is walked with the GPU ones in
test_tk_hw_cli.py (tests/data/bad_profiles/cpu_*.yaml).
"""

from __future__ import annotations

import dataclasses

import pytest

from tilekit.errors import ProfileError
from tilekit.hw import ENV_VAR, load_profile
from tilekit.hw.cpu import CpuLevel, gpu_view
from tilekit.hw.registry import read_profile_text
from tilekit.hw.schema import dimension_of

KiB, MiB, GiB = 2**10, 2**20, 2**30


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


# The figures the files cite (vendor pages, WikiChip, the AWS Graviton guide).
PUBLISHED = {
    #             march            cores thr  isa      width regs fma clock   L1         L2          L3 (one)  L3 by  DRAM all
    "milan":     ("znver3",         64, 128, "avx2",   32, 16, 2, 2.45e9, 32 * KiB, 512 * KiB, 32 * MiB, 8, 204.8e9),
    "icelake":   ("icelake-server", 40, 80, "avx512", 64, 32, 2, 2.3e9, 48 * KiB, 1280 * KiB, 60 * MiB, 40, 204.8e9),
    "graviton3": ("armv8.4-a+sve",  64, 64, "sve",    32, 32, 2, 2.6e9, 64 * KiB, 1 * MiB, 32 * MiB, 64, 307.2e9),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_figures(name):
    march, cores, threads, isa, width, regs, fma, clock, l1, l2, l3, l3_by, dram = PUBLISHED[name]
    p = load_profile(name)
    assert p.kind == "cpu" and p.is_cpu
    assert (p.march, p.cores, p.hardware_threads, p.isa) == (march, cores, threads, isa)
    assert (p.simd_bytes, p.vector_registers, p.fma_units, p.clock_hz) == (width, regs, fma,
                                                                           clock)
    assert [lv.name for lv in p.caches] == ["l1", "l2", "l3"]
    assert (p.cache("l1").capacity_bytes, p.cache("l2").capacity_bytes) == (l1, l2)
    assert (p.cache("l3").capacity_bytes, p.cache("l3").shared_by) == (l3, l3_by)
    assert p.cache("l1").private and p.cache("l2").private and not p.cache("l3").private
    assert p.cache("dram").bandwidth_all == dram
    assert p.cache("dram").shared_by == cores
    assert p.threads_per_core == threads // cores
    assert 1e-7 < p.fork_join_s < 1e-4


@pytest.mark.parametrize("name, fp64", [
    # cores x FMA units x fp64 lanes x 2 FLOP x clock
    ("milan", 64 * 2 * 4 * 2 * 2.45e9),
    ("icelake", 40 * 2 * 8 * 2 * 2.3e9),
    ("graviton3", 64 * 2 * 4 * 2 * 2.6e9),
])
def test_peaks_are_derived_per_core_and_per_chip(name, fp64):
    p = load_profile(name)
    assert p.peak_flops("fp64") == pytest.approx(fp64, rel=1e-12)
    assert p.peak_flops("float32") == pytest.approx(2 * fp64, rel=1e-12)
    assert p.peak_flops_per_core("fp64") * p.cores == pytest.approx(fp64, rel=1e-12)
    assert p.achievable_flops("fp32") == pytest.approx(2 * fp64 * p.achievable.compute)
    assert p.source("compute.peak.fp32").startswith(f"derived: {p.cores} cores x 2 FMA units")
    assert p.figure("compute.peak_per_core.fp64") == p.peak_flops_per_core("fp64")
    with pytest.raises(ProfileError, match=r"no peak for dtype 'fp16'.*has: fp64, fp32"):
        p.peak_flops("fp16")
    with pytest.raises(ProfileError, match=r"no peak for dtype 'bf16'"):
        p.peak_flops_per_core("bf16")


def test_milan_peaks_in_numbers():
    p = load_profile("milan")
    assert p.peak_flops("fp32") == pytest.approx(5017.6e9)
    assert p.peak_flops_per_core("fp32") == pytest.approx(78.4e9)
    assert p.simd_lanes("fp32") == 8 and p.simd_lanes("float64") == 4 and p.simd_lanes("int8") == 32


def test_cache_levels_and_totals():
    p = load_profile("milan")
    l3 = p.cache("l3")
    assert isinstance(l3, CpuLevel)
    assert l3.instances(p.cores) == 8 and l3.total_bytes(p.cores) == 256 * MiB
    assert l3.per_core_bytes == 4 * MiB
    assert l3.bandwidth_all > l3.bandwidth
    # a private level's all-core bandwidth is derived from one core's
    l1 = p.cache("l1")
    assert l1.bandwidth_all == pytest.approx(l1.bandwidth * 64)
    assert p.source("memory[l1].bandwidth_all").startswith("derived: memory[l1].bandwidth x 64")
    with pytest.raises(ProfileError, match=r"no memory level 'l4'.*has: l1, l2, l3, dram"):
        p.cache("l4")


def test_every_cpu_figure_path_resolves_and_has_a_dimension():
    for name in PUBLISHED:
        p = load_profile(name)
        for path in p.sources:
            value = p.figure(path)
            assert value is not None, path
            if path != "simd.isa":
                assert dimension_of(path) is not None, path


def test_gpu_profiles_have_no_cpu_figures():
    h100 = load_profile("h100")
    assert not h100.is_cpu and h100.cpu is None
    for attr in ("cores", "simd_bytes", "vector_registers", "fork_join_s", "march", "caches"):
        with pytest.raises(ProfileError, match="a simt profile has no"):
            getattr(h100, attr)
    with pytest.raises(ProfileError, match="a simt profile has no memory level 'l1'"):
        h100.cache("l1")
    with pytest.raises(ProfileError, match="a distributed profile has no"):
        load_profile("ipu").peak_flops_per_core("fp32")


def test_gpu_shaped_fields_of_a_cpu():
    """The mapping docs/hwprofiles.md documents: a core is an SM, its hardware threads one
    block of one-thread warps, L1 is shared memory, the outermost cache the device-wide L2."""
    p = load_profile("milan")
    assert (p.sm_count, p.warp_size, p.max_threads_per_block, p.max_blocks_per_sm) == (64, 1, 2, 1)
    assert p.max_warps_per_sm == p.max_threads_per_sm == 2
    assert p.max_regs_per_thread == 16 * 32 // 4 and p.regs_per_sm == 2 * 16 * 32 // 4
    assert p.smem_per_sm == p.smem_per_block == p.smem_per_block_static == 32 * KiB
    assert p.smem_bandwidth_per_sm == p.cache("l1").bandwidth
    assert p.smem_banks is None
    assert p.l2_bytes == 256 * MiB and p.l2_bandwidth == p.cache("l3").bandwidth_all
    assert (p.dram_bandwidth, p.dram_bytes) == (204.8e9, 256 * GiB)
    assert p.launch_overhead == p.fork_join_s
    assert not p.tensor_peaks and not p.mma_shapes and p.compute_capability is None
    assert p.achievable.smem == p.figure("achievable.cache") == 0.7
    assert [lv.name for lv in p.memory_levels] == ["registers", "l1", "l2", "l3", "dram"]
    assert [lv.scope for lv in p.memory_levels] == ["thread", "core", "core", "cluster",
                                                    "device"]
    assert p.level("registers").capacity_bytes == 512
    with pytest.raises(ProfileError, match="no memory level 'shared'"):
        p.level("shared")
    # without an l3, the outermost cache is l2
    g = load_profile("graviton3")
    no_l3 = g.with_cpu(levels=tuple(lv for lv in g.cpu.levels if lv.name != "l3"))
    assert no_l3.l2_bytes == 64 * MiB and no_l3.l2_bandwidth == no_l3.cache("l2").bandwidth_all


def test_variants_go_through_with_cpu():
    p = load_profile("milan")
    wider = p.with_cpu(cores=128, threads=256)
    assert wider.sm_count == 128 and wider.peak_flops("fp32") == pytest.approx(
        2 * p.peak_flops("fp32"))
    assert wider.cache("dram").shared_by == 128
    assert wider.source("compute.peak.fp32").startswith("derived: 128 cores")
    faster = p.with_cpu(clock_hz=3.0e9)
    assert faster.peak_flops_per_core("fp32") == pytest.approx(2 * 8 * 2 * 3.0e9)
    assert len({p.content_hash, wider.content_hash, faster.content_hash}) == 3
    assert wider == read_profile_text(_text_with_cores(128, 256), "x.yaml")
    # cores alone keep the threads per core (3 cores of milan's 64 x 2: 6 threads)
    assert p.with_cpu(cores=128) == wider
    assert load_profile("icelake").with_cpu(cores=3).cpu.threads == 6
    # the GPU-shaped fields cannot drift from the CPU figures
    with pytest.raises(ProfileError, match=r"sm_count is 3, but a cpu profile's sm_count "
                                           r"follows cores.physical \(64\).*with_cpu"):
        dataclasses.replace(p, sm_count=3)
    with pytest.raises(ProfileError, match=r"peaks .*follows the derived peaks"):
        dataclasses.replace(p, clock_hz=3.0e9)
    with pytest.raises(ProfileError, match=r"cores.threads: 100 hardware threads is not a "
                                           r"multiple of cores.physical 64"):
        p.with_cpu(threads=100)
    with pytest.raises(ProfileError, match="only a cpu profile has them"):
        dataclasses.replace(load_profile("h100"), cpu=p.cpu)


def _text_with_cores(cores: int, threads: int) -> str:
    from tilekit.hw import builtin_dir
    text = (builtin_dir() / "milan.yaml").read_text()
    return (text.replace("physical: {value: 64,", f"physical: {{value: {cores},")
            .replace("threads:  {value: 128,", f"threads:  {{value: {threads},"))


def test_gpu_view_is_the_one_mapping():
    p = load_profile("icelake")
    view = gpu_view(p.cpu, p.clock_hz)
    assert all(getattr(p, attr) == value for attr, value in view.items())


def test_to_dict_has_the_cpu_figures_and_gpu_profiles_hash_as_before():
    data = load_profile("graviton3").to_dict()
    assert data["cpu"]["isa"] == "sve" and data["cpu"]["levels"][0]["name"] == "l1"
    assert "cpu" not in load_profile("h100").to_dict()
    # the h100 hash the shipped IR goldens record (tests/golden/roll_mlp_h100)
    assert load_profile("h100").content_hash.startswith("7cc3950d4fd1")


def test_the_simd_isa_of_a_cpus_flags():
    from tilekit.hw.cpu import isa_of_flags

    assert isa_of_flags({"avx2", "fma", "avx512f"}, "x86_64") == "avx512"
    assert isa_of_flags({"avx2", "fma"}, "x86_64") == "avx2"
    assert isa_of_flags({"sse4_2"}, "x86_64") is None
    assert isa_of_flags({"asimd", "sve"}, "aarch64") == "sve"
    assert isa_of_flags({"asimd"}, "aarch64") == "neon"
    assert isa_of_flags({"v"}, "riscv64") is None


def test_the_host_profile_is_the_shipped_one_of_its_simd(monkeypatch):
    import tilekit.hw.cpu as hw_cpu
    from tilekit.hw import host_cpu_profile

    for isa, name in [("avx512", "icelake"), ("avx2", "milan"), ("sve", "graviton3")]:
        monkeypatch.setattr(hw_cpu, "host_isa", lambda isa=isa: isa)
        profile = host_cpu_profile(3)
        assert (profile.name, profile.cpu.isa, profile.cpu.cores) == (name, isa, 3)
    for isa in ("neon", None):
        monkeypatch.setattr(hw_cpu, "host_isa", lambda isa=isa: isa)
        assert host_cpu_profile(2) is None
