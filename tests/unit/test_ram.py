"""tk-ram: the program section, its verifier, the policies, the CPU program mode, the
picture, and the broken plans each check must catch (on the ResNeXt-style block and the
NASNet-style cell of tests/models/ram_models.py, rolled for the H100 with top-4 variants)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from tilekit import pipeline
from tilekit.errors import IRError
from tilekit.hw import load_profile
from tilekit.ir import dumps, loads, verify
from tilekit.ir.program import (TASK, WAIT, Item, parse_program, read_program,
                                verify_program)
from tilekit.ram import plan_module
from tilekit.ram.plan import plan
from tilekit.ram.svg import render
from tilekit.ram.tasks import Layout, flat_boxes, operators, welded_group
from tilekit.runtime.cpu import run_module
from tilekit.runtime.program import ProgramOrderError, run_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import ram_models  # noqa: E402

pytestmark = pytest.mark.xdist_group("ram")


def _compiled(tmp_path_factory, name: str, passes=("roll", "ram")):
    folder = tmp_path_factory.mktemp(name)
    path = folder / f"{name}.onnx"
    onnx.save(ram_models.ALL[name](), str(path))
    return pipeline.compile(path, passes=passes, hw="h100", top_k=4,
                            ir_path=folder / f"{name}.tk.yaml")


@pytest.fixture(scope="session")
def resnext(tmp_path_factory):
    return _compiled(tmp_path_factory, "resnext_block")


@pytest.fixture(scope="session")
def nasnet(tmp_path_factory):
    return _compiled(tmp_path_factory, "nasnet_cell")


def _inputs(module, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
            for n in module.inputs}


def _with_lists(program, s, lists):
    segments = list(program.segments)
    segments[s] = replace(segments[s], lists=tuple(tuple(x) for x in lists))
    return replace(program, segments=tuple(segments))


def _persistent(program):
    """The persistent segment with the most waits (the one a dropped barrier breaks)."""
    return max((s for s, seg in enumerate(program.segments) if seg.kind == "persistent"),
               key=lambda s: sum(i.kind == WAIT for items in program.segments[s].lists
                                 for i in items))


def _editable_lists(module):
    """The program, its most-waiting persistent segment and that segment's vEU lists as
    lists to edit."""
    program = read_program(module)
    s = _persistent(program)
    return program, s, [list(items) for items in program.segments[s].lists]


# -- the program section ---------------------------------------------------------------------

def test_program_reads_back_and_verifies(resnext):
    module = resnext.module
    program = read_program(module)
    assert program.record() == module.program
    assert loads(dumps(module), "m.yaml") == module
    verify(module, "m.yaml")
    assert program.policy == "wavefront" and program.hardware == "h100"
    # Every block of every operator is placed exactly once (also checked by the verifier).
    for seg in program.segments:
        if seg.kind == "persistent":
            for op in seg.operators:
                blocks = sorted(b for items in seg.lists for it in items
                                if it.kind == TASK and it.op == op
                                for b in range(it.first, it.first + it.count))
                assert blocks == list(range(program.operators[op].tasks))


def test_plans_are_deterministic(resnext):
    profile = load_profile("h100")
    bare = replace(resnext.module, program=None)
    first = plan_module(bare, profile).record()
    assert plan_module(bare, profile).record() == first
    assert render(parse_program(first), bare) == render(parse_program(first), bare)


def test_wavefront_beats_serial_and_per_op_kernels(resnext, nasnet):
    for compiled in (resnext, nasnet):
        est = read_program(compiled.module).estimate
        assert est["makespan_us"] < est["serial_us"] < est["per_op_kernels_us"]
        assert est["persistent_segments"] >= 1
        # The launch overhead and its source come from the profile.
        assert "assumed" in read_program(compiled.module).launch_source


def test_variants_come_from_the_roll_candidates(resnext):
    ops = operators(resnext.module, load_profile("h100"))
    assert any(len(op.variants) > 1 for op in ops)
    counts = {v.tasks for op in ops for v in op.variants if len(op.variants) > 1}
    assert len(counts) > 1  # variants differ in block count


def test_serial_policy_runs_one_operator_at_a_time(resnext):
    profile = load_profile("h100")
    serial = plan(replace(resnext.module, program=None), profile, "serial")
    from tilekit.ram.timeline import simulate
    for line in simulate(serial).segments:
        spans = {}
        for box in line.boxes:
            lo, hi = spans.get(box.op, (box.start, box.end))
            spans[box.op] = (min(lo, box.start), max(hi, box.end))
        ordered = sorted(spans.values())
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(ordered, ordered[1:]))


def test_an_operator_that_fills_the_device_stays_a_kernel():
    from tilekit.ram.plan import fills_device
    from tilekit.ram.tasks import Variant
    profile = load_profile("h100")
    big = Variant(0, 100000, 256, 32, 0, 10.0, 1.0, "tiled", Layout("whole", ()))
    small = Variant(0, 10, 256, 32, 0, 1.0, 1.0, "tiled", Layout("whole", ()))
    assert fills_device(profile, big) and not fills_device(profile, small)



def test_a_segment_holds_at_most_one_simt_gemm():
    """Two SIMT GEMM bodies in one persistent program took more than a thread's 255
    registers and spilled (ResNet-50's 1x1 convolutions rolled for the H100, `tk-codegen
    --compile --strict` refused the program): a segment admits one operator whose tile runs
    as the SIMT GEMM, and gives no other member a SIMT candidate."""
    from tilekit.ram.plan import pack_segment, segments_of
    from tilekit.ram.tasks import ROperator, Variant
    profile = load_profile("h100")
    whole = Layout("whole", ())
    simt = Variant(0, 8, 128, 160, 24576, 1.0, 1.0, "simt", whole)
    tiled = Variant(0, 8, 128, 32, 0, 1.0, 1.0, "tiled", whole)
    ops = tuple(ROperator(i, f"k{i}", (f"o{i}",), (v,))
                for i, v in enumerate((simt, simt, tiled)))
    segments = segments_of(ops, [0, 0, 0], profile)
    assert [(kind, members) for kind, members, _ in segments] == [
        ("kernel", [0]), ("persistent", [1, 2])]     # (two SIMT bodies shared one before)
    # a member whose own tile is staged does not take its SIMT candidate, however fast
    staged = Variant(0, 8, 128, 64, 8192, 4.0, 4.0, "staged", whole)
    fast_simt = Variant(1, 8, 128, 160, 24576, 0.5, 0.5, "simt", whole)
    ops = (ROperator(0, "k0", ("o0",), (simt,)),
           ROperator(1, "k1", ("o1",), (staged, fast_simt)))
    _, chosen = pack_segment(ops, [0, 1], [0, 0], [set(), set()], 8, 128, 255, 65536,
                             "wavefront")
    assert chosen[0].shape == "simt" and chosen[1].shape == "staged"


def test_a_segment_closes_where_its_members_together_would_fit_no_sm():
    """Each body fits an SM alone, but a slot takes the most of every resource: a 512-thread
    body beside a 96-register one (144 in a program) would be a slot of 512 x 144 registers,
    over an SM's 64 K, so the second starts a segment of its own (Inception v2 on the H100
    planned a segment of 0 vEUs before)."""
    from tilekit.ram.plan import segments_of
    from tilekit.ram.tasks import ROperator, Variant
    profile = load_profile("h100")
    wide = Variant(0, 4, 512, 32, 0, 1.0, 1.0, "tiled", Layout("whole", ()))
    heavy = Variant(0, 4, 128, 96, 0, 1.0, 1.0, "tiled", Layout("whole", ()))
    ops = tuple(ROperator(i, f"k{i}", (f"o{i}",), (v,))
                for i, v in enumerate((wide, wide, heavy, heavy)))
    segments = segments_of(ops, [0, 0, 0, 0], profile)
    assert [members for _, members, _ in segments] == [[0, 1], [2, 3]]
    assert [kind for kind, _, _ in segments] == ["persistent", "persistent"]

# -- the verifier catches broken plans ---------------------------------------------------------

def test_verifier_refuses_a_dropped_barrier(resnext):
    program, s, lists = _editable_lists(resnext.module)
    v = next(v for v, items in enumerate(lists) if any(i.kind == WAIT for i in items))
    lists[v] = [i for i in lists[v] if i.kind != WAIT]
    with pytest.raises(IRError, match="without waiting"):
        verify_program(resnext.module, _with_lists(program, s, lists))


def test_verifier_refuses_a_wait_on_a_later_task_of_the_same_veu(resnext):
    program, s, lists = _editable_lists(resnext.module)
    # vEU v waits on operator p, then runs one of p's own tasks: it can never proceed.
    v = next(v for v, items in enumerate(lists) if any(i.kind == WAIT for i in items))
    wait = next(i for i in lists[v] if i.kind == WAIT)
    donor = next(u for u, items in enumerate(lists)
                 if any(i.kind == TASK and i.op == wait.op for i in items))
    task = next(i for i in lists[donor] if i.kind == TASK and i.op == wait.op)
    lists[donor].remove(task)
    at = lists[v].index(wait)
    lists[v].insert(at + 1, task)
    with pytest.raises(IRError, match="deadlock"):
        verify_program(resnext.module, _with_lists(program, s, lists))


def test_verifier_refuses_a_block_placed_twice_and_a_useless_barrier(resnext):
    program, s, lists = _editable_lists(resnext.module)
    task = next(i for i in lists[0] if i.kind == TASK)
    twice = [lst + ([task] if v == 1 else []) for v, lst in enumerate(lists)]
    with pytest.raises(IRError, match="placed 2 times"):
        verify_program(resnext.module, _with_lists(program, s, twice))
    useless = [list(lst) for lst in lists]
    last_op = program.segments[s].operators[-1]
    useless[0].append(Item(WAIT, last_op, 0, program.operators[last_op].tasks))
    with pytest.raises(IRError, match="no later task"):
        verify_program(resnext.module, _with_lists(program, s, useless))


def test_a_malformed_item_is_located():
    payload = {"policy": "wavefront", "operators": [], "segments": [
        {"kind": "persistent", "operators": [], "threads": 32, "veus": 1,
         "lists": ["0:0+1 bogus"]}]}
    with pytest.raises(IRError, match=r"item 1 is 'bogus'") as err:
        parse_program(payload)
    assert err.value.where == "program.segments[0].lists[0]"


# -- the CPU program mode ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnext", "nasnet"])
def test_program_mode_matches_the_reference(name, request):
    compiled = request.getfixturevalue(name)
    module, weights = compiled.module, compiled.weights
    inputs = _inputs(module)
    got = run_program(module, inputs, weights)
    want = run_module(module, inputs, weights)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_program_mode_catches_a_dropped_barrier(nasnet):
    module = nasnet.module
    program = read_program(module)
    s = _persistent(program)
    lists = [[i for i in items if i.kind != WAIT] for items in program.segments[s].lists]
    with pytest.raises(ProgramOrderError, match="before operator"):
        run_program(module, _inputs(module), nasnet.weights, _with_lists(program, s, lists))


def test_program_mode_after_weld_style_groups(tmp_path_factory):
    compiled = _compiled(tmp_path_factory, "resnext_block", passes=("roll",))
    grouped = ram_models.weld_style(compiled.module)
    assert any(len(k.ops) > 1 for k in grouped.kernels)
    module = pipeline.run(grouped, ["ram"], pipeline.Context.for_hw("h100"))
    inputs = _inputs(module)
    got = run_program(module, inputs, compiled.weights)
    want = run_module(module, inputs, compiled.weights)
    np.testing.assert_allclose(got["out"], want["out"], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="session")
def welded(tmp_path_factory):
    """The ResNeXt-style block through tk-weld (fused multi-stage conv groups) and tk-ram."""
    return _compiled(tmp_path_factory, "resnext_block", passes=("roll", "weld", "ram"))


def _fused_operators(module):
    return [op for op in operators(module, load_profile("h100"))
            if op.best.shape == "fused"]


def test_fused_groups_are_rtasks_over_their_last_op(welded):
    """A multi-stage group is packed: a block per tile of its last op's output, with tk-weld's
    tile (tilekit.ram.tasks.welded_group), and its blocks cover that output exactly once."""
    module = welded.module
    fused = _fused_operators(module)
    assert fused and not any(op.fixed for op in fused)
    program = read_program(module)
    packed = {i for seg in program.segments if seg.kind == "persistent" for i in seg.operators}
    assert any(op.index in packed for op in fused), "no fused group joined a program segment"
    for op in fused:
        group = welded_group(module, op.index)
        out = _output_of(module, op.ops[-1])
        seen = np.zeros(module.tensors[out].shape, dtype=int)
        lay = op.best.layout
        assert lay.blocks == op.best.tasks == np.prod(group.grid)
        for b in range(lay.blocks):
            for box in lay.boxes(b):
                seen[tuple(slice(lo, hi) for lo, hi in box)] += 1
        assert (seen == 1).all(), op.kernel
        assert op.best.threads % 32 == 0 and op.best.barriers


def _output_of(module, op_name):
    from tilekit.ir.graph import graph
    return graph(module).node(op_name).writes[0]


def test_program_mode_runs_fused_groups_and_checks_their_reads(welded):
    module, weights = welded.module, welded.weights
    inputs = _inputs(module)
    got = run_program(module, inputs, weights)
    want = run_module(module, inputs, weights)
    np.testing.assert_allclose(got["out"], want["out"], rtol=1e-5, atol=1e-5)
    # a fused group's rTask before the operators it reads from: caught, not computed on NaN
    from tilekit.runtime.program import ProgramRun

    run = ProgramRun(module, read_program(module), inputs, weights)
    first = next(op.index for op in _fused_operators(module)
                 if any(r not in module.inputs for r in _reads(module, op)))
    with pytest.raises(ProgramOrderError, match="before operator"):
        run.run_task(first, 0, 1, "test")


def _reads(module, op):
    from tilekit.ir.graph import graph
    g = graph(module)
    inside = {t for n in op.ops for t in g.node(n).writes}
    return {t for n in op.ops for t in g.node(n).reads if t not in inside
            and t in module.tensors and module.tensors[t].role != "weight"}


def test_flat_ranges_cover_exactly_once():
    extents = (2, 3, 5)
    seen = np.zeros(extents, dtype=int)
    layout = Layout("flat", extents, per_block=7, blocks=3)
    for b in range(3):
        for box in layout.boxes(b):
            seen[tuple(slice(lo, hi) for lo, hi in box)] += 1
    assert (seen == 1).all()
    assert flat_boxes(4, 4, extents) == []


# -- the picture --------------------------------------------------------------------------------

def test_svg_structure(resnext):
    import xml.etree.ElementTree as ET
    from tilekit.ram.svg import KINDS
    from tilekit.ram.timeline import simulate

    program = read_program(resnext.module)
    text = render(program, resnext.module)
    assert text == render(program, resnext.module)  # deterministic bytes
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    root = ET.fromstring(text)  # well-formed: opens in a browser
    ns = "{http://www.w3.org/2000/svg}"
    timeline = simulate(program)
    boxes = [b for s in timeline.segments for b in s.boxes]
    # every rTask box is drawn, with its operator, rTasks, vEU and times on hover
    rects = [r for r in root.iter(f"{ns}rect") if r.get("class") == "rtask"]
    assert len(rects) == len(boxes)
    titles = [r.find(f"{ns}title").text for r in rects]
    first = boxes[0]
    op = program.operators[first.op]
    assert any(t.startswith(f"{op.kernel} (") and f"on vEU {first.veu}," in t for t in titles)
    # every vEU is a row: the lowest box of the widest segment is inside the plot
    most = max(s.veus for s in program.segments)
    assert max(b.veu for b in boxes) == most - 1
    # the colours drawn are the key's
    drawn = {r.get("fill") for r in rects}
    keyed = {c for dark, light, _ in KINDS.values() for c in (dark, light)}
    assert drawn <= keyed and len(drawn) > 1
    assert "rTasks coloured by operator kind" in text
    # barriers as before: one tick per wait
    waits = sum(1 for seg in program.segments for items in seg.lists for it in items
                if it.kind == WAIT)
    ticks = [p for p in root.iter(f"{ns}path") if p.get("class") == "barriers"]
    assert waits > 0 and sum(p.get("d").count("M") for p in ticks) == waits
    # segments labelled, the axis ticked, the estimates in the (wrapped) subtitle
    labels = [t for t in root.iter(f"{ns}text") if t.get("class") == "segment-label"]
    assert labels and labels[0].text == "S0"
    assert len([p for p in root.iter(f"{ns}path") if p.get("class") == "segment"]) == \
        len(program.segments)
    est = program.estimate
    flat = " ".join(t.text or "" for t in root.iter(f"{ns}text"))
    assert f"makespan {est['makespan_us']} us" in flat
    assert f"serial policy {est['serial_us']} us" in flat
    assert all(len(t.text or "") < 200 for t in root.iter(f"{ns}text"))
    numbers = [t.text for t in root.iter(f"{ns}text") if t.get("font-size") == "10"
               and (t.text or "").replace(".", "").isdigit()]
    assert len(numbers) >= 3  # tick labels on the time axis


def test_svg_of_a_large_program_titles_operators(resnext, monkeypatch):
    """Beyond PER_TASK_TITLES boxes, one shape per operator and segment carries the hover."""
    import tilekit.ram.svg as svg
    monkeypatch.setattr(svg, "PER_TASK_TITLES", 10)
    text = svg.render(read_program(resnext.module), resnext.module)
    assert 'class="rtask"' not in text and 'class="rtasks"' in text
    assert " rTasks, " in text


def test_svg_breaks_the_axis_at_launches_longer_than_the_work():
    from tilekit.ram.svg import _layout
    broken, gaps, widths = _layout([0.5, 0.1, 2.0], 4.0, 1000)
    assert broken and len(set(gaps)) == 1 and abs(sum(gaps) + sum(widths) - 1000) < 1e-6
    assert abs(widths[0] / 0.5 - widths[2] / 2.0) < 1e-9  # one scale for the segments
    broken, gaps, widths = _layout([100.0, 300.0], 4.0, 1000)
    assert not broken and abs(gaps[0] / 4.0 - widths[1] / 300.0) < 1e-9  # launches to scale


def test_variant_choice_follows_the_wave():
    """Fewer, longer tasks when the wave is full; more, shorter ones when vEUs are free."""
    from tilekit.ram.plan import pack_segment
    from tilekit.ram.tasks import ROperator, Variant

    wide = Variant(0, 8, 128, 32, 0, 1.0, 1.0, "tiled", Layout("whole", ()))  # 8 x 1 us
    narrow = Variant(1, 2, 128, 32, 0, 3.0, 3.0, "tiled", Layout("whole", ()))  # 2 x 3 us
    ops = (ROperator(0, "a", ("a",), (wide, narrow)),)
    _, free = pack_segment(ops, [0], [0], [set()], 8, 128, 128, 0, "wavefront")
    assert free[0].index == 0          # 8 free vEUs: 8 tasks end at 1 us
    _, busy = pack_segment(ops, [0], [0], [set()], 2, 128, 128, 0, "wavefront")
    assert busy[0].index == 1          # 2 vEUs: 2 tasks end at 3 us, 8 would end at 4 us
