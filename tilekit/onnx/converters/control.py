"""Control flow: Loop, If and Scan become control ops whose bodies are regions.

Each body is imported by `tilekit.onnx.subgraph.import_body` (a nested import: every converter
applies inside it, outer values are captured by name). Shapes stay static:

- Loop: carried values keep their shapes (a body that changes one is refused); scan outputs
  are stacked on a leading axis of `max_trips` rows: the trip count when it is a constant,
  else `--max-trips N` (a loop with scan outputs and a run-time bound is refused without
  it). When the number of iterations is known only at run time (a run-time trip count or a
  condition), the loop records a `count` and its scan outputs may only be graph outputs
  (they are trimmed to the count on return). A loop with neither bound nor condition is
  imported and runs until the executor's iteration budget.
- If: both branches must give the same shapes and dtypes.
- Scan (opset 9 and later): directions and axes per scan input and output; opset 8's batch
  axis and `sequence_lens` are refused.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tilekit.ir.control import ControlOp, Region
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter


def _where(ctx: NodeContext) -> str:
    return f"node {ctx.index} '{ctx.origin}'"


def _agree(ctx: NodeContext, region: Region, names: Sequence[str], expected: Sequence[Value],
           what: str) -> None:
    for name, value in zip(names, expected):
        t = region.tensors[name]
        if tuple(t.shape) != tuple(value.shape) or t.dtype != value.dtype:
            raise ctx.unsupported(
                f"{what} '{value.name}' is {value.dtype}{list(value.shape)} but the body makes "
                f"it {t.dtype}{list(t.shape)}", "tilekit needs static shapes: a carried "
                "value must keep its shape and type on every iteration")


def _out_value(ctx: NodeContext, i: int, shape, dtype: str) -> Value:
    """Output `i` of the node as a new IR tensor of this shape."""
    imp = ctx._imp
    onnx_name = ctx.node.output[i]
    name = imp.names.claim(onnx_name) if onnx_name else imp.names.fresh(f"{ctx.origin}_{i}")
    v = Value(name, tuple(int(d) for d in shape), dtype)
    if onnx_name:
        imp.values[onnx_name] = v
    return v


def _trip_bound(ctx: NodeContext) -> int | None:
    trip = ctx.input(0)
    if trip is not None and trip.const is not None:
        return max(0, int(np.asarray(trip.const).reshape(-1)[0]))
    return None


@converter("Loop", summary="control op (loop): body region, carried values, scan outputs "
           "stacked on max_trips rows with a run-time count")
def loop(ctx: NodeContext) -> None:
    body_graph = ctx.attr("body")
    trip, cond = ctx.input(0), ctx.input(1)
    carried = [ctx.input(i) for i in range(2, ctx.n_inputs)]
    if any(v is None for v in carried):
        raise ctx.unsupported("a loop-carried input is absent")
    n_scans = len(body_graph.output) - 1 - len(carried)
    bound = _trip_bound(ctx)
    if bound == 0 and n_scans:
        raise ctx.unsupported("the loop runs no iteration, so its scan outputs are empty",
                              "tilekit has no empty tensors")
    max_trips = bound if bound is not None else ctx._imp.max_trips
    if n_scans and max_trips is None:
        raise ctx.unsupported("the loop has scan outputs and its trip count is known only at "
                              "run time", "give a bound with tk-import --max-trips N")
    params = [(body_graph.input[0].name, (), "int64"), (body_graph.input[1].name, (), "bool")]
    params += [(g.name, v.shape, v.dtype) for g, v in zip(body_graph.input[2:], carried)]
    body = ctx._imp.import_body(body_graph, params, "body", _where(ctx))
    n = len(carried)
    _agree(ctx, body, body.outputs[1:1 + n], carried, "carried value")
    outputs = [_out_value(ctx, i, v.shape, v.dtype) for i, v in enumerate(carried)]
    scans = []
    for j, name in enumerate(body.outputs[1 + n:]):
        t = body.tensors[name]
        scans.append(_out_value(ctx, n + j, (max_trips, *t.shape), t.dtype))
    count = None
    if scans and (bound is None or cond is not None):
        count = ctx._imp.new_tensor(f"{ctx.origin}_count", (), "int64")
        for j, v in enumerate(scans):
            onnx_name = ctx.node.output[n + j]
            if ctx._imp.consumers.get(onnx_name):
                raise ctx.unsupported(
                    f"scan output '{onnx_name}' has a length known only at run time and is "
                    "read by another node", "tilekit runs such outputs only as graph outputs "
                    "(trimmed to the iterations run)")
    record = ControlOp(
        name="", kind="loop", regions=(body,), outputs=tuple(v.name for v in outputs),
        carried=tuple(ctx.name_of(v) for v in carried), scans=tuple(v.name for v in scans),
        cond=ctx.name_of(cond) if cond is not None else None,
        trip_count=ctx.name_of(trip) if trip is not None else None,
        max_trips=max_trips if (scans or bound) else None,
        count=count.name if count else None)
    ctx._imp.add_control_op(ctx, record, outputs + scans + ([count] if count else []))


@converter("If", summary="control op (if): two regions with the same outputs")
def if_(ctx: NodeContext) -> None:
    cond = ctx.input(0)
    if cond.size != 1:
        raise ctx.unsupported(f"the condition has {cond.size} elements", "If needs one")
    then = ctx._imp.import_body(ctx.attr("then_branch"), [], "then_branch", _where(ctx))
    else_ = ctx._imp.import_body(ctx.attr("else_branch"), [], "else_branch", _where(ctx))
    if len(then.outputs) != len(else_.outputs) or len(then.outputs) != ctx.n_outputs:
        raise ctx.unsupported("the branches give different numbers of outputs")
    outputs = []
    for i, (a, b) in enumerate(zip(then.outputs, else_.outputs)):
        ta, tb = then.tensors[a], else_.tensors[b]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            sources = ctx._imp.value_inputs(ctx.node.input[0])
            hint = ("tilekit needs static shapes: both branches must agree, or the condition "
                    "must be known at import")
            if sources:
                hint = (f"the condition depends on the value of graph input '{sources[0]}': "
                        f"fix it at import with --value {sources[0]}=V so the branch folds")
            raise ctx.unsupported(
                f"output {i} is {ta.dtype}{list(ta.shape)} in then_branch and "
                f"{tb.dtype}{list(tb.shape)} in else_branch", hint)
        outputs.append(_out_value(ctx, i, ta.shape, ta.dtype))
    record = ControlOp(name="", kind="if", regions=(then, else_),
                       outputs=tuple(v.name for v in outputs), cond=ctx.name_of(cond))
    ctx._imp.add_control_op(ctx, record, outputs)


@converter("Scan", summary="control op (scan): body region over slices of the scan inputs, "
           "directions and axes")
def scan(ctx: NodeContext) -> None:
    if ctx.opset < 9:
        raise ctx.unsupported("Scan-8 (batch axis and sequence_lens) is not supported",
                              "re-export with opset 9 or later")
    body_graph = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    values = ctx.inputs()
    n = len(values) - m
    carried, sources = values[:n], values[n:]
    in_axes = [a % max(1, v.rank) for a, v in
               zip(ctx.attr("scan_input_axes", [0] * m), sources)]
    in_rev = [bool(d) for d in ctx.attr("scan_input_directions", [0] * m)]
    k = len(body_graph.output) - n
    out_rev = [bool(d) for d in ctx.attr("scan_output_directions", [0] * k)]
    raw_out_axes = list(ctx.attr("scan_output_axes", [0] * k))
    trips = {v.shape[a] for v, a in zip(sources, in_axes)}
    if len(trips) != 1:
        raise ctx.unsupported(f"the scan inputs disagree on the number of iterations "
                              f"({sorted(trips)})")
    (count,) = trips
    params = [(g.name, v.shape, v.dtype) for g, v in zip(body_graph.input[:n], carried)]
    params += [(g.name, v.shape[:a] + v.shape[a + 1:], v.dtype)
               for g, v, a in zip(body_graph.input[n:], sources, in_axes)]
    body = ctx._imp.import_body(body_graph, params, "body", _where(ctx))
    _agree(ctx, body, body.outputs[:n], carried, "carried value")
    outputs = [_out_value(ctx, i, v.shape, v.dtype) for i, v in enumerate(carried)]
    scans, out_axes = [], []
    for j, name in enumerate(body.outputs[n:]):
        t = body.tensors[name]
        axis = raw_out_axes[j] % (len(t.shape) + 1)
        out_axes.append(axis)
        scans.append(_out_value(ctx, n + j, t.shape[:axis] + (count,) + t.shape[axis:],
                                t.dtype))
    record = ControlOp(
        name="", kind="scan", regions=(body,), outputs=tuple(v.name for v in outputs),
        carried=tuple(ctx.name_of(v) for v in carried), scans=tuple(v.name for v in scans),
        scan_inputs=tuple(ctx.name_of(v) for v in sources), input_axes=tuple(in_axes),
        input_reverse=tuple(in_rev), output_axes=tuple(out_axes),
        output_reverse=tuple(out_rev))
    ctx._imp.add_control_op(ctx, record, outputs + scans)


__all__ = ["if_", "loop", "scan"]
