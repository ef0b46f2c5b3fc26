"""Models with many small operators side by side, for tk-ram (Rammer's test cases).

- `resnext_block`: a ResNeXt-style block: the input split into `paths` narrow paths, each a
  1x1 convolution, ReLU, 3x3 convolution, ReLU (separate Conv nodes, not a grouped Conv, so that
  every path is its own operators), concatenated, a 1x1 convolution and the residual Add;
- `nasnet_cell`: a NASNet-style normal cell: separable convolutions (depthwise 3x3 and 5x5,
  pointwise 1x1), average and max pools and identities, pairwise added and concatenated;
- `inception_block`: an Inception-style block: `towers` times the four branches of
  GoogLeNet's module (1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max pool then 1x1), each
  convolution with its ReLU, every branch concatenated (not in `ALL`: the CPU benchmark's).

Both have seeded random weights and small dimensions (the CPU program mode and the emulation
run every rTask).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from models.onnx_models import FLOAT, _Graph


def _conv(g: _Graph, x: str, c_in: int, c_out: int, k: int, name: str, group: int = 1) -> str:
    w = g.weight(f"{name}.w", [c_out, c_in // group, k, k], 1.0 / np.sqrt(c_in // group * k * k))
    b = g.weight(f"{name}.b", [c_out], 0.1)
    return g.op("Conv", [x, w, b], name=name, kernel_shape=[k, k], pads=[k // 2] * 4,
                group=group)


def resnext_block(channels: int = 32, paths: int = 8, width: int = 4, size: int = 8,
                  seed: int = 11) -> onnx.ModelProto:
    g = _Graph("resnext_block", seed)
    x = "x"
    outs = []
    for p in range(paths):
        h = g.op("Relu", [_conv(g, x, channels, width, 1, f"p{p}_a")], name=f"p{p}_ra")
        h = g.op("Relu", [_conv(g, h, width, width, 3, f"p{p}_b")], name=f"p{p}_rb")
        outs.append(h)
    cat = g.op("Concat", outs, name="cat", axis=1)
    y = _conv(g, cat, paths * width, channels, 1, "merge")
    y = g.op("Relu", [g.op("Add", [y, x], name="residual")], name="out")
    shape = [1, channels, size, size]
    return g.model([helper.make_tensor_value_info(x, FLOAT, shape)],
                   [helper.make_tensor_value_info(y, FLOAT, shape)])


def _separable(g: _Graph, x: str, c: int, k: int, name: str) -> str:
    h = g.op("Relu", [x], name=f"{name}_relu")
    h = _conv(g, h, c, c, k, f"{name}_dw", group=c)
    return _conv(g, h, c, c, 1, f"{name}_pw")


def nasnet_cell(channels: int = 16, size: int = 8, seed: int = 12) -> onnx.ModelProto:
    g = _Graph("nasnet_cell", seed)
    x, prev = "x", "x_prev"
    c = channels
    b0 = g.op("Add", [_separable(g, x, c, 3, "s0a"), _separable(g, prev, c, 5, "s0b")],
              name="b0")
    b1 = g.op("Add", [_separable(g, prev, c, 5, "s1a"), _separable(g, prev, c, 3, "s1b")],
              name="b1")
    avg = g.op("AveragePool", [x], name="avg2", kernel_shape=[3, 3], pads=[1] * 4,
               strides=[1, 1], count_include_pad=0)
    b2 = g.op("Add", [avg, prev], name="b2")
    pool_a = g.op("AveragePool", [prev], name="avg3a", kernel_shape=[3, 3], pads=[1] * 4,
                  strides=[1, 1], count_include_pad=0)
    pool_b = g.op("MaxPool", [prev], name="max3b", kernel_shape=[3, 3], pads=[1] * 4,
                  strides=[1, 1])
    b3 = g.op("Add", [pool_a, pool_b], name="b3")
    b4 = g.op("Add", [_separable(g, x, c, 3, "s4a"), x], name="b4")
    y = g.op("Concat", [prev, b0, b1, b2, b3, b4], name="cell", axis=1)
    shape = [1, c, size, size]
    return g.model([helper.make_tensor_value_info(x, FLOAT, shape),
                    helper.make_tensor_value_info(prev, FLOAT, shape)],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 6 * c, size, size])])


def inception_block(channels: int = 32, size: int = 14, width: int = 8, towers: int = 2,
                    seed: int = 13) -> onnx.ModelProto:
    g = _Graph("inception_block", seed)
    x = "x"
    outs = []
    for t in range(towers):
        def conv(h, c_in, k, name):
            return g.op("Relu", [_conv(g, h, c_in, width, k, f"t{t}_{name}")],
                        name=f"t{t}_{name}_relu")

        outs.append(conv(x, channels, 1, "b1"))
        outs.append(conv(conv(x, channels, 1, "b3r"), width, 3, "b3"))
        outs.append(conv(conv(x, channels, 1, "b5r"), width, 5, "b5"))
        pool = g.op("MaxPool", [x], name=f"t{t}_pool", kernel_shape=[3, 3], pads=[1] * 4,
                    strides=[1, 1])
        outs.append(conv(pool, channels, 1, "bp"))
    y = g.op("Concat", outs, name="cat", axis=1)
    return g.model([helper.make_tensor_value_info(x, FLOAT, [1, channels, size, size])],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 4 * towers * width, size,
                                                             size])])


ALL = {"resnext_block": resnext_block, "nasnet_cell": nasnet_cell}


def weld_style(module):
    """`module` (a tile-IR Module) with tk-weld-like kernel groups, built without tk-weld: each
    op joined by the elementwise ops that consume its result at the same points (a chain: the
    groups codegen runs in one kernel), in the order of each group's last op (topological).
    Kernel estimates are dropped (they belonged to the singletons)."""
    from dataclasses import replace

    from tilekit.ir.graph import graph
    from tilekit.ir.model import Kernel

    g = graph(module)
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    for node in g.nodes:
        joined = None
        a = node.analysis
        if a is not None and not a.reduction and len(node.reads) >= 1:
            for t in node.reads:
                p = g.producer.get(t)
                if p is None or g.nodes[p].analysis is None:
                    continue
                pa = g.nodes[p].analysis
                same = tuple(e for _, e in pa.spatial) == tuple(e for _, e in a.spatial)
                only = len(g.consumers.get(t, ())) == 1 and t not in g.outputs
                if same and only and groups[group_of[p]][-1] == p:
                    joined = group_of[p]
                    break
        if joined is None:
            groups.append([node.index])
            group_of[node.index] = len(groups) - 1
        else:
            groups[joined].append(node.index)
            group_of[node.index] = joined
    groups.sort(key=lambda ops: ops[-1])
    kernels = [Kernel(name=f"w{k}_" + module.ops[ops[0]].name[:40],
                      ops=tuple(module.ops[i].name for i in ops))
               for k, ops in enumerate(groups)]
    return replace(module, kernels=tuple(kernels))
