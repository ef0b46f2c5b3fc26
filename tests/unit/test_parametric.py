"""Sizes as parameters of compiled CPU code (tilekit.codegen.parametric): templates, their
holes, and the printer's forms for sizes read at run time. End to end (one build for the
decode steps of a key/value cache): tests/e2e/test_dynamic_shapes.py."""

from __future__ import annotations

from tilekit.codegen.parametric import INT_SIZES, Abstract, Template, programs, template
from tilekit.tile import cpp
from tilekit.tile import expr as tx
from tilekit.tile.nodes import Buffer, Kernel, Seq, Store


def _abstract(*leaves):
    return Abstract(("structure",), tuple(leaves))


def test_a_template_has_holes_where_its_samples_differ():
    t = template([_abstract(1, 37, 8), _abstract(1, 41, 8), _abstract(1, 50, 8)])
    assert t.holes == (1,)
    assert t.match(_abstract(1, 44, 8))
    assert not t.match(_abstract(1, 44, 7))                 # a constant it does not share
    assert not t.match(Abstract(("other",), (1, 44, 8)))    # another structure
    assert t.values(_abstract(1, 44, 8)) == ((44,), ())


def test_widening_adds_the_leaves_a_size_changes():
    t = template([_abstract(1, 37, 8), _abstract(1, 41, 8)])
    wider = t.widened(_abstract(1, 44, 7))
    assert wider.holes == (1, 2) and wider.match(_abstract(1, 44, 7))
    assert wider.values(_abstract(2.5, 44, 7)) == ((44, 7), ())   # position 0 is no hole


def test_holes_equal_at_every_sample_share_a_slot():
    t = template([_abstract(37, 37, 8, 74), _abstract(41, 41, 8, 82)])
    assert t.holes == (0, 1, 3) and t.slots == (0, 0, 1)
    assert t.values(_abstract(44, 44, 8, 88)) == ((44, 88), ())
    assert not t.match(_abstract(44, 45, 8, 88))        # a slot's holes must agree
    wider = t.widened(_abstract(44, 45, 8, 88))
    assert wider.slots == (0, 1, 2) and wider.match(_abstract(44, 45, 8, 88))


def test_float_and_integer_holes_go_to_their_tables():
    t = Template(("s",), (0.25, 3), (0, 1), (0, 1))
    assert t.values(Abstract(("s",), (0.5, 4))) == ((4,), (0.5,))


def test_a_shared_buffer_with_a_size_read_at_run_time_indexes_through_it():
    rows = tx.Cast(tx.Load(INT_SIZES, (tx.Const(2, "int32"),), "int64"), "int32")
    b = Buffer("s_a", "shared", "float32", (4, rows))
    i, j = tx.Var("i", "int32"), tx.Var("j", "int32")
    flat = b.flat((i, j))
    k = Kernel("k", (), (b,), Store("s_a", (i, j), tx.Const(1.0, "float32")), 1, 1)
    text = cpp.CppPrinter(k).expr(flat)
    assert "tk_iz[2]" in text and "i" in text and "j" in text
    # a constant shape keeps the simplified form
    assert cpp.CppPrinter(k).expr(Buffer("c", "shared", "float32", (4, 8)).flat((i, j))) \
        == "8 * i + j"


def test_a_grid_read_at_run_time_prints_in_the_entries():
    grid = tx.Cast(tx.Load(INT_SIZES, (tx.Const(0, "int32"),), "int64"), "int32")
    k = Kernel("tk_k", (), (), Seq(()), 1, grid)
    entry = cpp.entry_function(k, tx.Cast(tx.Load(INT_SIZES, (tx.Const(1, "int32"),),
                                                  "int64"), "int32"))
    assert "tk_b < ((int)(tk_iz[0]))" in entry
    assert "tk_block_memory" in entry      # memory of a size read at run time: the arena
    entries = cpp.program_entries([("tk_k", 0, grid, True, False)], 64)
    assert "tk_iz[0]" in entries
    tables = cpp.size_tables(3, 1)
    assert "tk_iz[3]" in tables and "tk_fz[1]" in tables and "tk_set_sizes" in tables


def test_programs_read_only_the_holes():
    """A template's programs: a hole is a read of the tables, every other leaf its value."""
    from tilekit.codegen.parametric import _Walk

    body = Store("out", (tx.Var("i", "int32"),),
                 tx.Const(2.0, "float32") * tx.Load("x", (tx.Const(7, "int32"),), "float32"))
    k = Kernel("tk_k", (Buffer("out", "global", "float32", (8,), access="write"),
                        Buffer("x", "global", "float32", (8,))), (), body, 1, 4)
    blank = _Walk(lambda v, d: v if d in ("grid", "smem", "dim") else tx.Const(0, d),
                  blank=True).kernel(k)
    structure = (("n", "e", (), "s", (), (), (1, 1, 1), False, blank),)
    # leaves in walk order: grid 4, smem 0, the float 2.0, the index 7
    t = Template(structure, (4, 0, 2.0, 7), (0, 3), (0, 1))
    (made, smem), = programs(t)
    text = cpp.body_function(made)
    # the hole read once at the body's start, a local constant after
    assert "const int tk_zi1 = (int)(tk_iz[1]);" in text.replace("((int)(tk_iz[1]))",
                                                                  "(int)(tk_iz[1])")
    store = text.splitlines()[-2]
    assert smem == 0 and "tk_zi1" in store and "2.0" in store and "7" not in store
    assert made.grid == tx.Cast(tx.Load(INT_SIZES, (tx.Const(0, "int32"),), "int64"), "int32")


def _kv_structures(pasts, seq=1):
    """The structure digests of the key/value-cache step's CPU code at `pasts` (generated
    as tk-run's family generates a symbolic module's sizes: knowing its varying axes)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.onnx_models import kv_cache_step

    from tilekit.codegen.parametric import abstract
    from tilekit.ir.dims import instantiate
    from tilekit.onnx.importer import import_model
    from tilekit.runtime.family import CompiledFamily, _digest, varying_axes
    from tilekit.runtime.fold import fold_constants

    imported = import_model(kv_cache_step())
    family = CompiledFamily(imported.module, imported.weights)
    found = {}
    for past in pasts:
        values = {"seq": seq, "past": past}
        instance, _ = fold_constants(instantiate(imported.module, values), imported.weights)
        kernels = family._generated(instance, values, None).kernels
        found[past] = _digest(abstract(kernels).structure)
    return found, varying_axes(imported.module, {"seq": seq, "past": 5})


def test_varying_axes_are_the_extents_the_symbols_move():
    _, varying = _kv_structures([])
    ops = {op for op, _ in varying}
    # the cache's concatenation runs along past + seq, the query projection along seq
    assert ("Concat_3", "j") in varying and ("MatMul_0", "i") in varying
    # the projections' weights are 8 x 8 whatever the sizes: their axes stay fixed
    assert ("MatMul_0", "k") not in varying and ("MatMul_0", "j") not in varying
    assert "MatMul_0" in ops


def test_every_cache_length_of_a_decode_step_has_one_structure():
    """Lengths that used to split the code: a reduction short enough to unroll (<= 32), a
    tail of 0 lanes (a multiple of 16), a block of one row, one block or many, powers of two
    (the accumulator row's storage)."""
    found, _ = _kv_structures([1, 2, 7, 8, 15, 16, 31, 32, 47, 64, 129, 300])
    assert len(set(found.values())) == 1, found
