"""Small ONNX models with control flow (Loop, If, Scan), built with onnx.helper, for the
importer, the CPU executor, tk-grind and codegen (issue 11's test models):

- `lstm_loop`: an LSTM cell written out in a `Loop` over time steps (the step's input read by
  a Gather on the iteration number), hidden states stacked as a scan output;
- `gru_scan`: a GRU cell as a `Scan` over the sequence axis;
- `greedy_decoder`: a `Loop` bounded by a maximum length whose condition stops it on an end
  token (a run-time trip count: the emitted tokens come back with their run-time length);
- `blockdrop`: residual blocks, each in an `If` decided by a small policy network;
- `skipnet`: residual blocks each gated by an `If` on a gate computed from its own input;
- `nested_loops`: a `Loop` whose body holds a `Loop`, the inner body capturing values of
  both enclosing scopes.

`MODELS` maps each name to its builder; `feeds(name)` gives inputs that exercise it (for the
decoder, ones that stop on the end token before the bound).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from models.onnx_models import _Graph

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _body(g: _Graph, name: str, inputs, outputs) -> onnx.GraphProto:
    """The nodes and constants `g` collected, as a subgraph (a body or a branch)."""
    return helper.make_graph(g.nodes, name, inputs, outputs, g.inits)


def _sub(parent: _Graph, name: str) -> _Graph:
    """A builder for a body whose weights draw from the parent's random stream and whose
    names are prefixed (names are unique across a model's scopes)."""
    g = _Graph(name, 0)
    g.rng = parent.rng
    g.count = parent.count + 1000
    return g


def lstm_loop(seq: int = 6, batch: int = 1, inputs: int = 8, hidden: int = 16,
              seed: int = 0) -> onnx.ModelProto:
    g = _Graph("lstm_loop", seed)
    b = _sub(g, "lstm_body")
    w = b.weight("lstm_W", [inputs, 4 * hidden])
    r = b.weight("lstm_R", [hidden, 4 * hidden])
    bias = b.weight("lstm_B", [4 * hidden], 0.1)
    xt = b.op("Gather", ["x", "t"], axis=0)
    gates = b.op("Add", [b.op("Add", [b.op("MatMul", [xt, w]), b.op("MatMul", ["h", r])]),
                         bias])
    i, f, c_hat, o = b.op("Split", [gates, b.const("lstm_split", [hidden] * 4, np.int64)],
                          n_out=4, axis=1)
    c_next = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [f]), "c"]),
                          b.op("Mul", [b.op("Sigmoid", [i]), b.op("Tanh", [c_hat])])],
                  name="c_next")
    h_next = b.op("Mul", [b.op("Sigmoid", [o]), b.op("Tanh", [c_next])], name="h_next")
    b.op("Identity", ["cond_in"], name="cond_out")
    b.op("Identity", [h_next], name="h_step")
    body = _body(b, "lstm_body", [_vi("t", INT64, []), _vi("cond_in", BOOL, []),
                                  _vi("h", FLOAT, [batch, hidden]),
                                  _vi("c", FLOAT, [batch, hidden])],
                 [_vi("cond_out", BOOL, []), _vi("h_next", FLOAT, None),
                  _vi("c_next", FLOAT, None), _vi("h_step", FLOAT, None)])
    g.const("steps", np.asarray(seq, np.int64))
    g.const("keep_going", np.asarray(True))
    g.const("zeros", np.zeros((batch, hidden), np.float32))
    g.nodes.append(helper.make_node("Loop", ["steps", "keep_going", "zeros", "zeros"],
                                    ["h_last", "c_last", "hs"], name="lstm", body=body))
    y = g.op("MatMul", ["h_last", g.weight("head", [hidden, 4])], name="y")
    return g.model([_vi("x", FLOAT, [seq, batch, inputs])],
                   [_vi(y, FLOAT, [batch, 4]), _vi("hs", FLOAT, [seq, batch, hidden])])


def gru_scan(seq: int = 6, batch: int = 1, inputs: int = 8, hidden: int = 16,
             seed: int = 1) -> onnx.ModelProto:
    g = _Graph("gru_scan", seed)
    b = _sub(g, "gru_body")

    def gate(name: str, h: str, act: str) -> str:
        pre = b.op("Add", [b.op("MatMul", ["xt", b.weight(f"gru_W{name}", [inputs, hidden])]),
                           b.op("MatMul", [h, b.weight(f"gru_R{name}", [hidden, hidden])])])
        return b.op(act, [pre])

    z = gate("z", "hprev", "Sigmoid")
    r = gate("r", "hprev", "Sigmoid")
    n = gate("n", b.op("Mul", [r, "hprev"]), "Tanh")
    one = b.const("gru_one", np.ones((1,), np.float32))
    h = b.op("Add", [b.op("Mul", [b.op("Sub", [one, z]), n]), b.op("Mul", [z, "hprev"])],
             name="hnext")
    b.op("Identity", [h], name="ystep")
    body = _body(b, "gru_body", [_vi("hprev", FLOAT, [batch, hidden]),
                                 _vi("xt", FLOAT, [batch, inputs])],
                 [_vi("hnext", FLOAT, None), _vi("ystep", FLOAT, None)])
    g.nodes.append(helper.make_node("Scan", ["h0", "x"], ["h_T", "Y"], name="gru",
                                    body=body, num_scan_inputs=1))
    return g.model([_vi("h0", FLOAT, [batch, hidden]), _vi("x", FLOAT, [seq, batch, inputs])],
                   [_vi("h_T", FLOAT, [batch, hidden]), _vi("Y", FLOAT, [seq, batch, hidden])])


#: The decoder's end token and length bound (the end token is chosen so that the zero state
#: emits it after a few steps: see `greedy_decoder`).
DECODER_MAX = 8


def _decoder_step(emb, w, u, v, token, h):
    h = np.tanh(emb[token] @ w + h @ u)
    return int(np.argmax(h @ v, axis=1)[0]), h


def greedy_decoder(vocab: int = 12, hidden: int = 16, seed: int = 2) -> onnx.ModelProto:
    g = _Graph("greedy_decoder", seed)
    emb = (g.rng.standard_normal((vocab, hidden))).astype(np.float32)
    w = (g.rng.standard_normal((hidden, hidden)) / 4).astype(np.float32)
    u = (g.rng.standard_normal((hidden, hidden)) / 4).astype(np.float32)
    v = (g.rng.standard_normal((hidden, vocab))).astype(np.float32)
    # The end token: what the zero state emits at step 2, so that feeds() stops early.
    token, h = 0, np.zeros((1, hidden), np.float32)
    for _ in range(3):
        token, h = _decoder_step(emb, w, u, v, np.asarray([token]), h)
    end = token
    b = _sub(g, "dec_body")
    for name, value in (("dec_E", emb), ("dec_W", w), ("dec_U", u), ("dec_V", v)):
        b.const(name, value)
    e = b.op("Gather", ["dec_E", "tok"], axis=0)
    hn = b.op("Tanh", [b.op("Add", [b.op("MatMul", [e, "dec_W"]),
                                    b.op("MatMul", ["hid", "dec_U"])])], name="hid_next")
    # Greedy choice as max, compare and min (the first index holding the maximum), which
    # stays affine, so the body fuses (an ArgMax would be an opaque op: a kernel of its own,
    # tests/unit/test_opaque_kernels.py).
    logits = b.op("MatMul", [hn, "dec_V"])
    best = b.op("ReduceMax", [logits], axes=[1], keepdims=1)
    index = b.op("Where", [b.op("Equal", [logits, best]),
                           b.const("dec_iota", np.arange(vocab, dtype=np.float32)),
                           b.const("dec_big", np.asarray([1e9], np.float32))])
    nxt = b.op("Cast", [b.op("ReduceMin", [index], axes=[1], keepdims=0)], to=INT64,
               name="tok_next")
    b.op("Not", [b.op("Equal", [nxt, b.const("dec_end", np.asarray([end], np.int64))])],
         name="go_on")
    b.op("Identity", [nxt], name="emitted")
    body = _body(b, "dec_body", [_vi("step", INT64, []), _vi("go", BOOL, []),
                                 _vi("tok", INT64, [1]), _vi("hid", FLOAT, [1, hidden])],
                 [_vi("go_on", BOOL, None), _vi("tok_next", INT64, None),
                  _vi("hid_next", FLOAT, None), _vi("emitted", INT64, None)])
    g.const("max_len", np.asarray(DECODER_MAX, np.int64))
    g.const("start", np.asarray([0], np.int64))
    g.const("go0", np.asarray(True))
    g.nodes.append(helper.make_node("Loop", ["max_len", "go0", "start", "h0"],
                                    ["last_tok", "h_end", "tokens"], name="decode", body=body))
    return g.model([_vi("h0", FLOAT, [1, hidden])],
                   [_vi("tokens", INT64, ["n", 1]), _vi("h_end", FLOAT, [1, hidden])])


def _residual_branch(parent: _Graph, name: str, x: str, width: int) -> onnx.GraphProto:
    b = _sub(parent, name)
    y = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, b.weight(f"{name}_W", [width, width])]),
                                   b.weight(f"{name}_b", [width], 0.1)])])
    b.op("Add", [y, x], name=f"{name}_out")
    return _body(b, name, [], [_vi(f"{name}_out", FLOAT, None)])


def _skip_branch(name: str, x: str) -> onnx.GraphProto:
    node = helper.make_node("Identity", [x], [f"{name}_out"], name=f"{name}_id")
    return helper.make_graph([node], name, [], [_vi(f"{name}_out", FLOAT, None)])


def _gated_residual(g: _Graph, score: str, x: str, width: int, tag: str) -> str:
    """`If(score > 0.5)`: a residual block on `x`, else `x` itself; returns the output."""
    keep = g.op("Greater", [g.op("Reshape", [score, g.const(f"{tag}_one", [1], np.int64)]),
                            g.const(f"{tag}_half", [0.5], np.float32)], name=f"{tag}_keep")
    out = f"{tag}_out"
    g.nodes.append(helper.make_node(
        "If", [keep], [out], name=f"{tag}_if",
        then_branch=_residual_branch(g, f"{tag}_blk", x, width),
        else_branch=_skip_branch(f"{tag}_skip", x)))
    return out


def blockdrop(width: int = 16, blocks: int = 3, seed: int = 3) -> onnx.ModelProto:
    g = _Graph("blockdrop", seed)
    policy = g.op("Sigmoid", [g.linear("x", width, blocks, "policy")], name="policy")
    x = "x"
    for k in range(blocks):
        p = g.op("Slice", [policy, g.const(f"s{k}", [k], np.int64),
                           g.const(f"e{k}", [k + 1], np.int64),
                           g.const(f"a{k}", [1], np.int64)], name=f"p{k}")
        x = _gated_residual(g, p, x, width, f"block{k}")
    y = g.op("MatMul", [x, g.weight("classifier", [width, 4])], name="logits")
    return g.model([_vi("x", FLOAT, [1, width])], [_vi(y, FLOAT, [1, 4])])


def skipnet(width: int = 16, blocks: int = 2, seed: int = 4) -> onnx.ModelProto:
    g = _Graph("skipnet", seed)
    x = "x"
    for k in range(blocks):
        pooled = g.op("ReduceMean", [x], axes=[1], keepdims=1, name=f"pool{k}")
        gate = g.op("Sigmoid", [g.op("Mul", [pooled, g.const(f"gw{k}", [3.0], np.float32)])])
        x = _gated_residual(g, gate, x, width, f"gate{k}")
    return g.model([_vi("x", FLOAT, [1, width])], [_vi(x, FLOAT, [1, width])])


def nested_loops(rows: int = 2, cols: int = 8, outer: int = 3, inner: int = 2,
                 seed: int = 5) -> onnx.ModelProto:
    g = _Graph("nested_loops", seed)
    ib = _sub(g, "inner_body")
    scale = ib.op("Cast", ["i_outer"], to=FLOAT, name="outer_as_float")
    step = ib.op("Add", [ib.op("Mul", ["acc_in", "w_shared"]),
                         ib.op("Mul", ["x", scale])], name="acc_next")
    ib.op("Identity", ["ci"], name="co")
    inner_body = _body(ib, "inner_body", [_vi("j", INT64, []), _vi("ci", BOOL, []),
                                          _vi("acc_in", FLOAT, [rows, cols])],
                       [_vi("co", BOOL, None), _vi(step, FLOAT, None)])
    ob = _sub(g, "outer_body")
    ob.const("n_inner", np.asarray(inner, np.int64))
    ob.nodes.append(helper.make_node("Loop", ["n_inner", "", "acc"], ["acc_inner"],
                                     name="inner", body=inner_body))
    out = ob.op("Tanh", ["acc_inner"], name="acc_out")
    ob.op("Identity", ["oc"], name="oc_out")
    ob.op("ReduceSum", [out, ob.const("sum_axes", [1], np.int64)], keepdims=0, name="row_sum")
    outer_body = _body(ob, "outer_body", [_vi("i_outer", INT64, []), _vi("oc", BOOL, []),
                                          _vi("acc", FLOAT, [rows, cols])],
                       [_vi("oc_out", BOOL, None), _vi(out, FLOAT, None),
                        _vi("row_sum", FLOAT, None)])
    g.weight("w_shared", [rows, cols], 0.5)
    g.const("n_outer", np.asarray(outer, np.int64))
    g.nodes.append(helper.make_node("Loop", ["n_outer", "", "x"], ["final", "sums"],
                                    name="outer", body=outer_body))
    return g.model([_vi("x", FLOAT, [rows, cols])],
                   [_vi("final", FLOAT, [rows, cols]), _vi("sums", FLOAT, [outer, rows])])


MODELS = {"lstm_loop": lstm_loop, "gru_scan": gru_scan, "greedy_decoder": greedy_decoder,
          "blockdrop": blockdrop, "skipnet": skipnet, "nested_loops": nested_loops}


def feeds(name: str, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for model `name`, keyed by ONNX name: random, except the decoder's zero state
    (which meets its end token before the bound)."""
    from models.onnx_check import random_inputs

    out = random_inputs(model, seed)
    if name == "greedy_decoder":
        out = {k: np.zeros_like(v) for k, v in out.items()}
    return out
