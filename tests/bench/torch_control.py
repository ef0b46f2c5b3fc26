"""ONNX Loop, If and Scan for the GPU benchmark's PyTorch eager baseline.

    model = ControlModel(onnx_model, "cuda")
    outputs = model(*inputs)

Every node runs as one torch call (tests/bench/torch_onnx.py's `OPS`), in graph order; a
control node runs its subgraph in Python the way a PyTorch user writes the loop: the trip count
and the condition are read back with `.item()` (a host synchronisation per iteration), a
branch reads its predicate, scan outputs are stacked with `torch.stack`. Values of enclosing
scopes are visible inside a subgraph by name. Eager only (no torch.compile: data-dependent
control flow breaks its graph).
"""

from __future__ import annotations

import torch
from onnx import numpy_helper

from torch_onnx import OPS, Node, _attrs, reduce

#: Ops the control models need beyond torch_onnx's table.
EXTRA = {"ReduceMin": reduce(torch.amin)}


class ControlModel(torch.nn.Module):
    """An ONNX model with control flow, eager; forward(*inputs) -> tuple of outputs."""

    def __init__(self, model, device="cpu"):
        super().__init__()
        self.device = torch.device(device)
        self.opset = next((o.version for o in model.opset_import
                           if o.domain in ("", "ai.onnx")), 1)
        self.graph = model.graph
        self._consts: dict[int, tuple] = {}
        self.input_names = [vi.name for vi in model.graph.input
                            if vi.name not in {t.name for t in model.graph.initializer}]
        self.output_names = [vi.name for vi in model.graph.output]

    def _constants(self, graph) -> dict[str, torch.Tensor]:
        # keyed by id, holding the graph: a branch read from its node's attributes may be a
        # new object per read, and a freed one's id is reused by the next
        held = self._consts.get(id(graph))
        if held is None or held[0] is not graph:
            held = self._consts[id(graph)] = (graph, {
                t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.device)
                for t in graph.initializer})
        return held[1]

    def run_graph(self, graph, scope: dict, inputs: dict) -> list[torch.Tensor]:
        values = {**scope, **self._constants(graph), **inputs}
        for proto in graph.node:
            node = Node(proto.op_type, proto.name, tuple(proto.input), tuple(proto.output),
                        _attrs(proto), self.opset)
            args = [values[name] if name else None for name in node.inputs]
            if node.op_type in ("Loop", "Scan", "If"):
                outs = getattr(self, f"_{node.op_type.lower()}")(node, values, args)
            else:
                node.static = {i: a.tolist() for i, a in enumerate(args) if a is not None
                               and not a.is_floating_point() and a.numel() <= 64}
                fn = EXTRA.get(node.op_type) or OPS[node.op_type]
                out = fn(node, *args)
                outs = out if isinstance(out, (tuple, list)) else (out,)
            for name, value in zip(node.outputs, outs):
                if name:
                    values[name] = value
        return [values[o.name] for o in graph.output]

    def _loop(self, node, values, args):
        body = node.attrs["body"]
        trips = int(args[0].item()) if args[0] is not None else None
        go = bool(args[1].item()) if args[1] is not None else True
        carried, scans, i = list(args[2:]), [], 0
        while go and (trips is None or i < trips):
            names = [v.name for v in body.input]
            feeds = dict(zip(names, [torch.tensor(i, device=self.device),
                                     torch.tensor(go, device=self.device), *carried]))
            out = self.run_graph(body, values, feeds)
            if args[1] is not None:
                go = bool(out[0].item())
            carried = out[1:1 + len(carried)]
            scans.append(out[1 + len(carried):])
            i += 1
        stacked = [torch.stack(col) for col in zip(*scans)] if scans else []
        return (*carried, *stacked)

    def _scan(self, node, values, args):
        body, m = node.attrs["body"], node.attrs["num_scan_inputs"]
        n = len(args) - m
        axes = node.attrs.get("scan_input_axes", [0] * m)
        carried, sources = list(args[:n]), args[n:]
        trips = sources[0].shape[axes[0]]
        rows = []
        for t in range(trips):
            slices = [s.select(a, t) for s, a in zip(sources, axes)]
            out = self.run_graph(body, values, dict(zip([v.name for v in body.input],
                                                        carried + slices)))
            carried, rows = out[:n], rows + [out[n:]]
        return (*carried, *[torch.stack(col) for col in zip(*rows)])

    def _if(self, node, values, args):
        branch = node.attrs["then_branch" if bool(args[0].item()) else "else_branch"]
        return tuple(self.run_graph(branch, values, {}))

    def forward(self, *inputs):
        return tuple(self.run_graph(self.graph, {}, dict(zip(self.input_names, inputs))))
