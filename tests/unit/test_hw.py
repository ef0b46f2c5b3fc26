"""tilekit.hw: shipped profiles, name resolution, the Profile record and its rules, units."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from tilekit.errors import ProfileError
from tilekit.hw import (ENV_VAR, Profile, builtin_dir, list_profiles, load_profile,
                        profile_names, read_profile_file)
from tilekit.hw.registry import read_profile_text
from tilekit.hw.schema import SOURCE_KINDS, dimension_of
from tilekit.hw.units import format_quantity, to_base

SHIPPED = sorted(builtin_dir().glob("*.yaml"))
KiB, MiB = 2**10, 2**20


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


# -- shipped profiles ----------------------------------------------------------------------------

SHIPPED_NAMES = ["a100", "graviton3", "h100", "icelake", "ipu", "milan", "rtx4090", "v100"]


def test_the_shipped_profiles(no_env):
    assert profile_names() == SHIPPED_NAMES
    assert [p.name for p in list_profiles()] == profile_names()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_profile_validates_and_every_figure_has_a_source(path):
    p = read_profile_file(path)
    assert p.name == path.stem
    assert p.sources, "a profile without figures"
    for fig_path, ref in p.sources.items():
        p.figure(fig_path)  # every sourced path resolves to a value
        kind = ref.partition(":")[0]
        assert ref in p.references or kind in SOURCE_KINDS, (fig_path, ref)
        assert p.source(fig_path).strip()
    for key, text in p.references.items():
        assert text.strip(), key
    # the cost model's inputs are all there and positive
    for attr in ("sm_count", "smem_per_block", "smem_per_sm", "smem_bandwidth", "dram_bandwidth",
                 "transaction_bytes", "clock_hz", "max_regs_per_thread", "regs_per_sm"):
        assert getattr(p, attr) > 0, attr
    assert p.peak_flops("fp32") > 0
    assert 0 < p.achievable.dram <= 1 and 0 < p.achievable.compute <= 1


# The published figures (datasheets, whitepapers), checked against what the files say.
PUBLISHED = {
    #          arch    SMs  smem/SM  opt-in    L2       DRAM B/s  FP32    tensor fp16
    "h100":    ("sm_90", 132, 228 * KiB, 227 * KiB, 50 * MiB, 3.35e12, 66.9e12, 989.4e12),
    "a100":    ("sm_80", 108, 164 * KiB, 163 * KiB, 40 * MiB, 2.039e12, 19.5e12, 312e12),
    "v100":    ("sm_70", 80, 96 * KiB, 96 * KiB, 6 * MiB, 0.9e12, 15.7e12, 125e12),
    # The often quoted ~330 TFLOP/s is with FP16 accumulation; the profile records FP32 accumulate.
    "rtx4090": ("sm_89", 128, 100 * KiB, 99 * KiB, 72 * MiB, 1.008e12, 82.6e12, 165.2e12),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_figures(name):
    arch, sms, smem_sm, optin, l2, dram, fp32, fp16_tc = PUBLISHED[name]
    p = load_profile(name)
    assert (p.arch, p.sm_count, p.smem_per_sm, p.smem_per_block) == (arch, sms, smem_sm, optin)
    assert p.smem_per_block_static == 48 * KiB
    assert (p.l2_bytes, p.dram_bandwidth, p.peak_flops("fp32")) == (l2, dram, fp32)
    assert p.peak_flops("float16", tensor_core=True) == fp16_tc
    assert (p.warp_size, p.max_regs_per_thread, p.transaction_bytes) == (32, 255, 32)
    assert p.kind == "simt" and p.vendor == "nvidia"


def test_h100_details():
    p = load_profile("h100")
    assert p.compute_capability == (9, 0)
    assert p.features.tma and p.features.clusters and p.features.async_copy
    assert p.smem_banks == 32 and p.smem_bank_bytes == 4
    assert p.smem_bandwidth == pytest.approx(128 * 1.98e9 * 132)
    assert p.achievable.dram == pytest.approx(3.0 / 3.35, abs=0.01)  # measured on this project's H100
    assert p.source("achievable.dram").startswith("measured:")
    assert "datasheet" in p.source("memory[dram].bandwidth")
    assert [lv.name for lv in p.memory_levels] == ["registers", "shared", "l2", "dram"]
    assert p.level("registers").capacity_bytes == 256 * KiB
    assert any(s.instruction.startswith("wgmma") for s in p.mma_shapes)
    assert not load_profile("a100").features.tma


def test_ipu_is_a_distributed_profile_mapped_onto_the_same_fields():
    p = load_profile("ipu")
    assert p.kind == "distributed" and p.compute_capability is None
    assert (p.sm_count, p.warp_size, p.max_threads_per_sm) == (1472, 1, 6)
    assert p.smem_per_sm == p.smem_per_block == 624 * KiB
    assert not p.has_l2 and p.l2_bandwidth is None
    assert [lv.name for lv in p.memory_levels] == ["registers", "shared", "dram"]
    assert p.exchange_bandwidth == 8e12
    assert p.peak_flops("fp16", tensor_core=True) == 250e12
    with pytest.raises(ProfileError, match="no memory level 'l2'"):
        p.level("l2")


# -- resolution ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["h100", "H100", "h100-sxm", "H100-SXM5",
                                      "hwprofiles/h100.yaml"])
def test_resolve_by_name_alias_and_path(spelling, no_env, monkeypatch):
    monkeypatch.chdir(builtin_dir().parent)
    assert load_profile(spelling).name == "h100"


def test_resolve_by_path_object_anywhere(tmp_path):
    copy = tmp_path / "mine.yaml"
    shutil.copy(builtin_dir() / "v100.yaml", copy)
    p = load_profile(copy)
    assert p == load_profile("v100")  # equality ignores where the file lives
    assert p.content_hash == load_profile("v100").content_hash
    assert p.origin == str(copy)


def test_unknown_name_lists_the_known_ones(no_env):
    with pytest.raises(ProfileError) as err:
        load_profile("h1000")
    msg = err.value.message()
    assert msg.startswith("h1000: unknown hardware profile")
    assert "did you mean 'h100'" in msg
    for name in SHIPPED_NAMES:
        assert name in msg


def test_missing_path_is_located():
    with pytest.raises(ProfileError, match=r"nope/x\.yaml: no such file"):
        load_profile("nope/x.yaml")


def test_env_folders_come_first_and_can_add_profiles(tmp_path, monkeypatch):
    text = (builtin_dir() / "h100.yaml").read_text()
    (tmp_path / "h100.yaml").write_text(text.replace("value: 132,", "value: 144,"))
    (tmp_path / "h100x2.yaml").write_text(
        text.replace("name: h100", "name: h100x2").replace("aliases: [h100-sxm, h100-sxm5, H100]",
                                                           "aliases: [big-hopper]"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert load_profile("h100").sm_count == 144         # the override wins
    assert load_profile("big-hopper").name == "h100x2"  # aliases of extra folders resolve
    names = profile_names()
    assert names.count("h100") == 1 and "h100x2" in names
    assert {p.name for p in list_profiles()} >= {"h100", "h100x2", "ipu"}


def test_env_folder_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(ProfileError, match=ENV_VAR):
        load_profile("h100")


def test_ambiguous_alias_is_an_error_naming_both(tmp_path, monkeypatch):
    text = (builtin_dir() / "a100.yaml").read_text()
    (tmp_path / "one.yaml").write_text(text.replace("name: a100", "name: one"))
    (tmp_path / "two.yaml").write_text(text.replace("name: a100", "name: two"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(ProfileError, match=r"ambiguous.*one\.yaml.*two\.yaml"):
        load_profile("a100-sxm")


# -- profile identity: copies, content hashes, folders shared with other YAML -------------------

def _copy_keeping_the_name(folder, stem="mine"):
    text = (builtin_dir() / "h100.yaml").read_text()
    path = folder / f"{stem}.yaml"
    path.write_text(text.replace("value: 3.35, unit: TB/s", "value: 2.0, unit: TB/s"))
    return path


def test_a_search_folder_may_hold_ir_documents_and_other_yaml(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text("tilekit: 1\nmodel: m\ninputs: []\n")
    (tmp_path / "compose.yml").write_text("services:\n  web: {image: x}\n")
    (tmp_path / "v100x.yaml").write_text((builtin_dir() / "v100.yaml").read_text()
                                         .replace("name: v100", "name: v100x")
                                         .replace("aliases: [v100-sxm2, v100-sxm2-32gb, V100]",
                                                  "aliases: []"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert profile_names() == sorted([*SHIPPED_NAMES, "v100x"])
    assert {p.name for p in list_profiles()} >= {"v100x", "h100"}
    from tilekit.hw.registry import listing, looks_like_profile
    assert not looks_like_profile(tmp_path / "m.yaml")
    assert [e.profile.name for e in listing()].count("v100x") == 1


def test_listing_marks_a_copy_that_shadows_a_shipped_name(tmp_path, monkeypatch):
    from tilekit.hw.registry import listing
    mine = _copy_keeping_the_name(tmp_path)
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    h100 = [e for e in listing() if e.profile.name == "h100"]
    assert [e.path.name for e in h100] == ["mine.yaml", "h100.yaml"]
    assert h100[0].shadowed_by is None and not h100[0].shipped
    assert h100[1].shipped and h100[1].file() == "<shipped>/h100.yaml"
    assert h100[1].shadowed_by.resolve() == mine.resolve()


def test_a_recorded_hash_refuses_a_profile_of_other_figures(tmp_path, monkeypatch):
    from tilekit.hw import load_recorded_profile
    shipped = load_profile("h100")
    _copy_keeping_the_name(tmp_path)
    # without the copy on the search path the recorded hash matches
    assert load_recorded_profile("h100", None, shipped.content_hash) is shipped
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    ir = tmp_path / "m.rolled.yaml"
    with pytest.raises(ProfileError) as err:
        load_recorded_profile("h100", str(ir), shipped.content_hash)
    text = err.value.message()
    assert text.startswith(f"hardware: m.rolled.yaml was made with a 'h100' profile of other "
                           f"figures (sha256 {shipped.content_hash[:12]}) than mine.yaml")
    assert f"pass --hw {builtin_dir() / 'h100.yaml'}" in text  # the file it was made with
    assert "re-run tk-roll --hw h100" in text
    # the old plain-name form (no hash) is read as before, without a check
    assert load_recorded_profile("h100", str(ir)).dram_bandwidth == 2.0e12


def test_the_ir_records_the_hash_and_reads_the_plain_name(tmp_path):
    from tilekit.ir import dumps, loads
    from tilekit.roll import roll_module
    text = ("tilekit: 1\nmodel: m\nhardware: h100\nstages: [{name: import}]\ninputs: [x]\n"
            "outputs: [y]\ntensors:\n  x: {shape: [4], dtype: float32, role: input}\n"
            "  y: {shape: [4], dtype: float32, role: output}\n"
            "ops:\n  - {name: id, expr: 'y[i] = x[i]'}\n")
    old = loads(text)
    assert old.hardware == "h100" and old.hardware_sha256 is None
    rolled = roll_module(old, load_profile("h100"))
    assert rolled.hardware_sha256 == load_profile("h100").content_hash
    again = loads(dumps(rolled))
    assert (again.hardware, again.hardware_sha256) == ("h100", rolled.hardware_sha256)
    assert f"hardware:\n  name: h100\n  sha256: {rolled.hardware_sha256}\n" in dumps(rolled)
    from tilekit.errors import IRError
    from tilekit.ir.verify import verify
    with pytest.raises(IRError, match="hardware.sha256"):
        verify(loads(text.replace("hardware: h100", "hardware: {name: h100, sha256: abc}")))
    with pytest.raises(IRError, match="hardware"):
        loads(text.replace("hardware: h100", "hardware: {name: h100}"))


# -- variants: more SMs, more bandwidth ----------------------------------------------------------

def test_variants_are_representable_and_checked():
    base = load_profile("h100")
    wider = dataclasses.replace(base, sm_count=2 * base.sm_count)
    faster = dataclasses.replace(base, dram_bandwidth=2 * base.dram_bandwidth)
    assert wider.sm_count == 264 and wider.smem_bandwidth == 2 * base.smem_bandwidth
    assert faster.dram_bandwidth == 6.7e12
    assert len({base.content_hash, wider.content_hash, faster.content_hash}) == 3
    assert base != wider and hash(base) != hash(wider)
    with pytest.raises(ProfileError, match=r"memory\[shared\]\.per_block_optin: .*per-SM"):
        dataclasses.replace(base, smem_per_block=base.smem_per_sm + 1024)
    with pytest.raises(ProfileError, match=r"memory\[dram\]\.bandwidth: must be positive"):
        dataclasses.replace(base, dram_bandwidth=-1.0)
    with pytest.raises(ProfileError, match=r"achievable\.dram"):
        dataclasses.replace(base, achievable=dataclasses.replace(base.achievable, dram=1.5))


def test_hash_covers_numbers_not_provenance():
    base = load_profile("a100")
    renamed = dataclasses.replace(base, sources={**base.sources, "compute.clock": "assumed: x"},
                                  description="other words")
    assert renamed.content_hash == base.content_hash
    assert re.fullmatch(r"a100:[0-9a-f]{12}", base.identity())


def test_peak_lookup_accepts_ir_dtype_names_and_lists_what_is_missing():
    p = load_profile("v100")
    assert p.peak_flops("float32") == p.peak_flops("fp32") == 15.7e12
    assert p.has_peak("float16", tensor_core=True) and not p.has_peak("bf16", tensor_core=True)
    assert p.achievable_flops("fp16", tensor_core=True) == pytest.approx(125e12 * 0.75)
    with pytest.raises(ProfileError, match=r"no peak for dtype 'bfloat16'.*has: fp16"):
        p.peak_flops("bfloat16", tensor_core=True)


# -- the file format (the full catalogue of bad files is walked in test_tk_hw_cli.py) ------------

def _shipped_text(name: str) -> str:
    return (builtin_dir() / f"{name}.yaml").read_text()


def test_negative_bandwidth_names_the_field_and_line():
    text = _shipped_text("h100").replace("{value: 3.35, unit: TB/s", "{value: -3.35, unit: TB/s")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "-3.35" in s)
    with pytest.raises(ProfileError) as err:
        read_profile_text(text, "h100.yaml")
    assert err.value.message() == (f"h100.yaml:{line}: memory[dram].bandwidth: "
                                   "must be positive, got -3.35 TB/s")


def test_missing_sm_count_names_the_field():
    text = re.sub(r"\n  sm_count: [^\n]*", "", _shipped_text("a100"))
    with pytest.raises(ProfileError, match=r"^a100\.yaml:\d+: parallelism\.sm_count: missing"):
        read_profile_text(text, "a100.yaml")


def test_in_place_sources_need_a_reason():
    text = re.sub(r"fp16:  \{value: 31.4, [^\n]*",
                  'fp16: {value: 31.4, unit: TFLOP/s, source: "derived:  "}', _shipped_text("v100"))
    with pytest.raises(ProfileError, match=r"compute\.simt\.fp16: unknown source"):
        read_profile_text(text, "v100.yaml")


def test_units_convert_to_base_units_exactly():
    assert to_base(66.9, 1e12) == 66.9e12
    assert to_base(227, 2**10) == 232448
    assert to_base(1.5, 1) == 1.5
    assert format_quantity(232448, "bytes") == "227 KiB"
    assert format_quantity(112e9, "bytes") == "112 GB"
    assert format_quantity(3.35e12, "bandwidth") == "3.35 TB/s"
    assert format_quantity(1.98e9, "frequency") == "1.98 GHz"
    assert dimension_of("memory[l2].capacity") == "bytes"
    assert dimension_of("compute.tensor_core.fp16") == "rate"
    assert dimension_of("parallelism.sm_count") == "count"


def test_profile_is_plain_data():
    p = load_profile("rtx4090")
    data = p.to_dict()
    assert data["sm_count"] == 128 and "origin" not in data
    assert Profile(**{**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}}) == p


# -- achievable fractions and launch overhead ------------------------------------------------

@pytest.mark.parametrize("name", ["h100", "a100", "v100", "rtx4090"])
def test_nvidia_profiles_state_a_sourced_launch_overhead(name, no_env):
    p = load_profile(name)
    assert 1e-6 <= p.launch_overhead <= 1e-5
    assert p.figure("launch.overhead") == p.launch_overhead
    assert p.source("launch.overhead").startswith("assumed:")


def test_ipu_has_no_launch_overhead(no_env):
    assert load_profile("ipu").launch_overhead is None


def test_simt_and_tensor_compute_fractions_are_apart(no_env):
    """h100's 0.81 was measured on a bf16 tensor-core matmul: it is the tensor fraction."""
    p = load_profile("h100")
    assert p.achievable.compute_tensor == 0.81
    assert p.source("achievable.compute_tensor").startswith("measured:")
    assert p.source("achievable.compute").startswith("assumed:")
    assert p.achievable_flops("bf16", tensor_core=True) == pytest.approx(
        p.peak_flops("bf16", tensor_core=True) * 0.81)
    assert p.achievable_flops("fp32") == pytest.approx(p.peak_flops("fp32")
                                                       * p.achievable.compute)
    from tilekit.roll.cost import machine
    m = machine(p, "float32")
    assert m.peak == pytest.approx(p.peak_flops("fp32") * p.achievable.compute)
    assert m.launch_s == p.launch_overhead


def test_launch_overhead_is_a_time_with_a_unit():
    text = _shipped_text("h100").replace("{value: 4, unit: us,", "{value: 4, unit: GB,")
    with pytest.raises(ProfileError, match=r"launch\.overhead"):
        read_profile_text(text, "h100.yaml")
    text = _shipped_text("h100").replace("{value: 4, unit: us,", "{value: 4000, unit: ns,")
    assert read_profile_text(text, "h100.yaml").launch_overhead == pytest.approx(4e-6)
