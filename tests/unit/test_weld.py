"""tk-weld's parts: propagation with halos, levels, liveness allocation, the payload round
trip, connect-then-fuse options, the verifier's located errors and the command's exit codes."""

from __future__ import annotations

import copy
import os
import subprocess
from types import SimpleNamespace
from pathlib import Path

import pytest
import yaml

from tilekit.codegen.plan import plan_group, readers
from tilekit.errors import IRError, TilekitError
from tilekit.hw import load_profile
from tilekit.ir import dumps, loads, read_module, verify
from tilekit.ir.graph import graph
from tilekit.ir.payloads import GroupTile
from tilekit.weld import connect_then_fuse, weld_module
from tilekit.weld.structure import Buffer, allocate, propagate, structure
from tilekit.weld.verify import check_groups

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "weld"


@pytest.fixture(scope="session")
def h100():
    return load_profile("h100")


def fixture(name):
    return read_module(str(DATA / f"{name}.yaml"))


def test_propagation_adds_the_halo_of_a_3x3_reader(h100):
    m = fixture("conv_chain")
    members = list(range(len(m.ops)))
    prop = propagate(m, members, (1, 16, 2, 4))
    # conv3 (1x1) and relu2/conv2 see the block; relu1 and conv1 the 3x3 halo: +2 rows, +2 cols
    assert prop.lengths(4) == (1, 16, 2, 4)
    assert prop.lengths(2) == (1, 8, 2, 4)
    assert prop.lengths(1) == (1, 8, 4, 6) and prop.lengths(0) == (1, 8, 4, 6)
    assert prop.recompute > 1.0           # neighbouring blocks recompute the halo


def test_a_reduction_reader_sees_the_whole_row():
    m = fixture("softmax")
    prop = propagate(m, [0, 1, 2], (2, 8))
    assert prop.lengths(0) == (2,) and prop.lengths(2) == (2, 8)
    s = structure(m, [0, 1, 2])
    assert s.stages == 3 and [e.level for e in s.edges] == ["shared", "shared"]


def test_a_reused_elementwise_result_is_shared_not_inlined():
    m = fixture("attention")
    s = structure(m, range(len(m.ops)))
    roles = dict(zip(s.names, s.roles))
    assert roles["prob"] == "stage"          # pv reads p[h,i,j] for every d: reuse
    assert roles["scale_mask"] == "chain"
    m2 = fixture("matmul_bias_gelu")
    assert structure(m2, range(4)).roles == ("stage", "chain", "chain", "chain")


def test_liveness_lets_a_later_buffer_take_a_dead_ones_bytes():
    placed, total = allocate([Buffer("a", 100, 0, 1), Buffer("b", 64, 1, 2),
                              Buffer("c", 96, 2, 3)])
    offsets = {b.tensor: b.offset for b in placed}
    assert offsets["a"] == 0 and offsets["b"] == 112 and offsets["c"] == 0
    assert total == 176


def test_codegen_plans_what_weld_recorded(h100):
    """Weld's roles are the code generator's stages, chains and inlined ops."""
    for name in sorted(p.stem for p in DATA.glob("*.yaml")):
        m = weld_module(fixture(name), h100)
        for kernel in m.kernels:
            if not kernel.tile:
                continue
            plan = plan_group(m, kernel, kernel.name, readers(m))
            roles = {mm["op"]: mm["role"] for mm in kernel.tile["members"]}
            assert [s.main.op.name for s in plan.stages] == [o for o in kernel.ops
                                                             if roles[o] == "stage"], name
            assert set(plan.inlined) == {o for o in kernel.ops if roles[o] == "inline"}, name
            shared = {e["tensor"] for e in kernel.tile["edges"] if e["level"] == "shared"}
            assert plan.shared == shared, name


def test_payload_reads_back_equal(h100):
    m = weld_module(fixture("attention"), h100, top_k=3)
    k = m.kernels[0]
    last = graph(m).nodes[len(m.ops) - 1].analysis
    group = GroupTile.read(k.tile, last.spatial, (), "kernels[0].tile")
    assert group.record() == k.tile
    assert len(group.candidates) == 2
    assert loads(dumps(m)) == m


def test_no_fuse_and_max_group(h100):
    m = fixture("conv_bias_relu")
    rolled = weld_module(m, h100)   # rolls what is unrolled
    assert list(rolled.stage_names()) == ["import", "roll", "weld"]
    assert connect_then_fuse(rolled, h100, no_fuse=("bias",)) == [[0], [1], [2]]
    assert connect_then_fuse(rolled, h100, max_group=2) == [[0, 1], [2]]
    assert connect_then_fuse(rolled, h100) == [[0, 1, 2]]
    with pytest.raises(TilekitError, match="names ops the module does not have"):
        weld_module(m, h100, no_fuse=("nope",))


def test_a_profile_without_shared_memory_is_refused(tmp_path):
    """The profile loader refuses it (located); a profile object without any is refused by
    tk-weld itself."""
    text = (ROOT / "hwprofiles" / "h100.yaml").read_text()
    lines = [ln for ln in text.splitlines() if "per_block_optin" not in ln]
    (tmp_path / "noshared.yaml").write_text("\n".join(lines) + "\n")
    proc = run(f"tk-weld --hw noshared.yaml {DATA / 'softmax.yaml'} -o out.yaml", tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "memory[shared]" in proc.stderr and not (tmp_path / "out.yaml").exists()
    with pytest.raises(TilekitError, match="no shared memory"):
        weld_module(fixture("softmax"), SimpleNamespace(name="flat", smem_per_block=0))


def _mutated(module, mutate):
    data = yaml.safe_load(dumps(module))
    mutate(data)
    return loads(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("mutate, where, what", [
    (lambda d: d["kernels"][0]["tile"]["edges"][1].update(level="register"),
     "kernels[0] (k_qk).tile.edges[1].level", "cannot be at level 'register'"),
    (lambda d: d["kernels"][0]["tile"]["edges"][1].update(level="hbm"),
     "kernels[0] (k_qk).tile.edges[1].level", "must be one of"),
    (lambda d: d["kernels"][0]["tile"]["members"][0]["region"].__setitem__(2, 1),
     "kernels[0] (k_qk).tile.members[0].region", "does not cover"),
    (lambda d: d["kernels"][0]["tile"]["members"][4].update(role="inline"),
     "kernels[0] (k_qk).tile.members[4].role", "runs as 'stage'"),
    (lambda d: d["kernels"][0]["tile"]["grid"].update(i=3),
     "kernels[0] (k_qk).tile.grid.i", "does not match"),
])
def test_verifier_errors_are_located(h100, mutate, where, what):
    m = _mutated(weld_module(fixture("attention"), h100), mutate)
    with pytest.raises(IRError) as info:
        check_groups(m, h100)
    assert where in str(info.value) and what in str(info.value)


def test_verifier_checks_the_flash_form(h100):
    m = weld_module(fixture("attention_long"), h100)
    assert m.kernels[0].tile["flash"] == {"key": "j", "step": 64}
    for mutate, what in [
            (lambda d: d["kernels"][0]["tile"]["flash"].update(step=32), "steps of 64"),
            (lambda d: d["kernels"][0]["tile"]["flash"].update(key="e"), "key axis 'j'")]:
        with pytest.raises(IRError, match=what):
            check_groups(_mutated(m, mutate), h100)
    short = _mutated(weld_module(fixture("attention"), h100),
                     lambda d: d["kernels"][0]["tile"].update(flash={"key": "j", "step": 64}))
    check_groups(short, h100)      # 16 keys: attention, so a flash form is allowed
    softmax = _mutated(weld_module(fixture("softmax"), h100),
                       lambda d: d["kernels"][0]["tile"].update(flash={"key": "j", "step": 64}))
    with pytest.raises(IRError, match="is not attention"):
        check_groups(softmax, h100)


def test_verifier_knows_the_shared_memory_limit(h100):
    m = weld_module(fixture("attention"), h100)
    smem = m.kernels[0].tile["smem_bytes"]
    with pytest.raises(IRError, match=f"more than the profile's {smem - 16}"):
        check_groups(m, SimpleNamespace(name="small", smem_per_block=smem - 16))


def run(cmd, cwd):
    env = dict(os.environ, PATH=f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_command_bad_input_exits_2_with_one_located_line(tmp_path, h100):
    welded = weld_module(fixture("attention"), h100)
    bad = _mutated(welded, lambda d: d["kernels"][0]["tile"]["edges"][1].update(
        level="register"))
    (tmp_path / "bad.yaml").write_text(dumps(bad))
    (tmp_path / "ok.yaml").write_text(dumps(welded))
    for cmd, where in [("tk-codegen bad.yaml -o out.yaml", "edges[1].level"),
                       ("tk-run bad.yaml --mode tiled --seed 0", "edges[1].level"),
                       ("tk-weld ok.yaml --no-fuse nope -o out.yaml", "--no-fuse"),
                       ("tk-weld ok.yaml --max-group 0", "--max-group")]:
        proc = run(cmd, tmp_path)
        assert proc.returncode == 2, (cmd, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and where in lines[0], (cmd, proc.stderr)
        assert not (tmp_path / "out.yaml").exists()


def test_command_is_deterministic_and_reports(tmp_path):
    src = DATA / "attention.yaml"
    first = run(f"tk-weld --hw h100 {src} --report", tmp_path)
    second = run(f"tk-weld --hw h100 {src}", tmp_path)
    assert first.returncode == 0 and first.stdout == second.stdout
    assert "kernels 6 -> 1" in first.stderr and "k_qk" in first.stderr
    assert "compulsory 21,184 -> 4,160" in first.stderr
    verify(loads(first.stdout), "-")
