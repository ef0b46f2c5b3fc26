"""Small ONNX models built with onnx.helper for import tests: each builder returns a
`ModelProto` with seeded random weights and small dimensions.

- `bert_encoder_layer`: fused QKV MatMul, Split, Reshape/Transpose into heads, scaled Softmax
  attention, LayerNormalization, Gelu written with Erf;
- `gpt_block`: pre-norm block with a causal mask applied by Where and the tanh form of Gelu;
- `mobilenet_block`: inverted residual (1x1 expand, depthwise 3x3, 1x1 project) with
  BatchNormalization, Clip as ReLU6, residual Add, GlobalAveragePool, Flatten, Gemm;
- `mlp_mixer_block`: token mixing through Transpose, channel mixing, LayerNormalization;
- `lstm_model`: the ONNX LSTM op with biases and initial states;
- `softmax_chain`, `layer_norm_chain` (the op, or `decomposed` as exporters write it) and
  `mlp_epilogue` (MatMul, bias, erf GELU, residual): the memory-bound chains alone;
- `kv_cache_step`: one attention head over a key/value cache of dynamic length (symbolic
  `seq` and `past`), the decoder step of the dynamic-shape tests and bench.

`with_batch(model, n)` rebuilds a batch-1 model (the bundled light_* ones) at batch `n`.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class _Graph:
    """A tiny graph builder: named nodes, seeded weights, one opset."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def weight(self, name: str, shape, scale: float | None = None) -> str:
        fan_in = shape[0] if len(shape) > 1 else 1
        std = scale if scale is not None else 1.0 / math.sqrt(max(fan_in, 1))
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal(shape) * std).astype(np.float32), name))
        return name

    def const(self, name: str, value, dtype=None) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None,
           **attrs) -> str | list[str]:
        self.count += 1
        base = name or f"{op_type.lower()}{self.count}"
        outs = [base] if n_out == 1 else [f"{base}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="tilekit-tests")
        model.ir_version = 8
        return model

    # -- common blocks -------------------------------------------------------------------
    def linear(self, x: str, d_in: int, d_out: int, prefix: str) -> str:
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", [d_in, d_out])])
        return self.op("Add", [y, self.weight(f"{prefix}.bias", [d_out], 0.1)])

    def layer_norm(self, x: str, dim: int, prefix: str) -> str:
        gamma = self.const(f"{prefix}.gamma", 1 + 0.1 * self.rng.standard_normal(dim),
                           np.float32)
        beta = self.const(f"{prefix}.beta", 0.1 * self.rng.standard_normal(dim), np.float32)
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)

    def gelu_erf(self, x: str) -> str:
        scaled = self.op("Div", [x, self.const(f"sqrt2_{self.count}", math.sqrt(2.0),
                                               np.float32)])
        erf = self.op("Erf", [scaled])
        one_plus = self.op("Add", [erf, self.const(f"one_{self.count}", 1.0, np.float32)])
        half_x = self.op("Mul", [x, self.const(f"half_{self.count}", 0.5, np.float32)])
        return self.op("Mul", [half_x, one_plus])

    def gelu_tanh(self, x: str) -> str:
        cube = self.op("Pow", [x, self.const(f"three_{self.count}", 3.0, np.float32)])
        inner = self.op("Add", [x, self.op("Mul", [cube, self.const(
            f"c044715_{self.count}", 0.044715, np.float32)])])
        scaled = self.op("Mul", [inner, self.const(f"sqrt2pi_{self.count}",
                                                   math.sqrt(2 / math.pi), np.float32)])
        t = self.op("Tanh", [scaled])
        one_plus = self.op("Add", [t, self.const(f"one_{self.count}", 1.0, np.float32)])
        half_x = self.op("Mul", [x, self.const(f"half_{self.count}", 0.5, np.float32)])
        return self.op("Mul", [half_x, one_plus])


def bert_encoder_layer(batch: int = 2, seq: int = 8, hidden: int = 16, heads: int = 2,
                       ffn: int = 32, seed: int = 0) -> onnx.ModelProto:
    g = _Graph("bert_encoder_layer", seed)
    dh = hidden // heads
    x = "input_ids/embeddings:0"  # a name that needs sanitising
    qkv = g.linear(x, hidden, 3 * hidden, "attention.qkv")
    q, k, v = g.op("Split", [qkv, g.const("split_sizes", [hidden] * 3, np.int64)], n_out=3,
                   axis=-1)
    head_shape = g.const("head_shape", [batch, seq, heads, dh], np.int64)

    def heads_of(t: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [t, head_shape])], perm=perm)

    qh, kh, vh = heads_of(q, [0, 2, 1, 3]), heads_of(k, [0, 2, 3, 1]), heads_of(v, [0, 2, 1, 3])
    scores = g.op("MatMul", [qh, kh])
    scaled = g.op("Div", [scores, g.const("scale", math.sqrt(dh), np.float32)])
    mask = g.const("attention_mask", np.where(np.arange(seq) < seq - 2, 0.0, -1e4)
                   .reshape(1, 1, 1, seq), np.float32)
    probs = g.op("Softmax", [g.op("Add", [scaled, mask])], axis=-1)
    context = g.op("MatMul", [probs, vh])
    merged = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]),
                              g.const("merged_shape", [batch, seq, hidden], np.int64)])
    attn = g.linear(merged, hidden, hidden, "attention.output")
    h1 = g.layer_norm(g.op("Add", [attn, x]), hidden, "attention.ln")
    inter = g.gelu_erf(g.linear(h1, hidden, ffn, "intermediate"))
    out = g.linear(inter, ffn, hidden, "output")
    y = g.layer_norm(g.op("Add", [out, h1]), hidden, "output.ln")
    y = g.op("Identity", [y], name="last_hidden_state")
    return g.model([helper.make_tensor_value_info(x, FLOAT, [batch, seq, hidden])],
                   [helper.make_tensor_value_info(y, FLOAT, [batch, seq, hidden])])


def gpt_block(batch: int = 1, seq: int = 8, hidden: int = 16, heads: int = 2,
              seed: int = 1) -> onnx.ModelProto:
    g = _Graph("gpt_block", seed)
    dh = hidden // heads
    x = "x"
    h = g.layer_norm(x, hidden, "ln_1")
    qkv = g.linear(h, hidden, 3 * hidden, "attn.c_attn")
    q, k, v = g.op("Split", [qkv, g.const("split_sizes", [hidden] * 3, np.int64)], n_out=3,
                   axis=2)
    head_shape = g.const("head_shape", [batch, seq, heads, dh], np.int64)
    qh = g.op("Transpose", [g.op("Reshape", [q, head_shape])], perm=[0, 2, 1, 3])
    kh = g.op("Transpose", [g.op("Reshape", [k, head_shape])], perm=[0, 2, 3, 1])
    vh = g.op("Transpose", [g.op("Reshape", [v, head_shape])], perm=[0, 2, 1, 3])
    scores = g.op("Mul", [g.op("MatMul", [qh, kh]),
                          g.const("inv_sqrt_dh", 1 / math.sqrt(dh), np.float32)])
    causal = g.const("causal_mask", np.tril(np.ones((seq, seq), dtype=bool))
                     .reshape(1, 1, seq, seq))
    masked = g.op("Where", [causal, scores, g.const("neg_inf", -1e9, np.float32)])
    probs = g.op("Softmax", [masked], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [ctx, g.const("merged_shape", [batch, seq, hidden], np.int64)])
    h1 = g.op("Add", [x, g.linear(merged, hidden, hidden, "attn.c_proj")])
    m = g.gelu_tanh(g.linear(g.layer_norm(h1, hidden, "ln_2"), hidden, 4 * hidden, "mlp.c_fc"))
    y = g.op("Add", [h1, g.linear(m, 4 * hidden, hidden, "mlp.c_proj")], name="y")
    return g.model([helper.make_tensor_value_info(x, FLOAT, [batch, seq, hidden])],
                   [helper.make_tensor_value_info(y, FLOAT, [batch, seq, hidden])])


def mobilenet_block(channels: int = 8, expand: int = 4, size: int = 12, classes: int = 10,
                    seed: int = 2, batch: int = 1) -> onnx.ModelProto:
    g = _Graph("mobilenet_block", seed)
    wide = channels * expand

    def bn(x: str, c: int, prefix: str) -> str:
        return g.op("BatchNormalization", [
            x, g.const(f"{prefix}.weight", 1 + 0.1 * g.rng.standard_normal(c), np.float32),
            g.const(f"{prefix}.bias", 0.1 * g.rng.standard_normal(c), np.float32),
            g.const(f"{prefix}.running_mean", 0.1 * g.rng.standard_normal(c), np.float32),
            g.const(f"{prefix}.running_var", g.rng.uniform(0.5, 1.5, c), np.float32)],
            epsilon=1e-3)

    def relu6(x: str) -> str:
        return g.op("Clip", [x, g.const(f"zero{g.count}", 0.0, np.float32),
                             g.const(f"six{g.count}", 6.0, np.float32)])

    x = "image"
    e = relu6(bn(g.op("Conv", [x, g.weight("expand.weight", [wide, channels, 1, 1], 0.3)]),
                 wide, "expand.bn"))
    d = relu6(bn(g.op("Conv", [e, g.weight("dw.weight", [wide, 1, 3, 3], 0.3)], group=wide,
                      pads=[1, 1, 1, 1]), wide, "dw.bn"))
    p = bn(g.op("Conv", [d, g.weight("project.weight", [channels, wide, 1, 1], 0.3)]),
           channels, "project.bn")
    r = g.op("Add", [x, p])
    s = g.op("Conv", [r, g.weight("stride2.weight", [channels, 1, 3, 3], 0.3),
                      g.weight("stride2.bias", [channels], 0.1)],
             group=channels, strides=[2, 2], auto_pad="SAME_UPPER")
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [relu6(s)])], axis=1)
    logits = g.op("Gemm", [pooled, g.weight("classifier.weight", [classes, channels], 0.3),
                           g.weight("classifier.bias", [classes], 0.1)], transB=1,
                  name="logits")
    return g.model([helper.make_tensor_value_info(x, FLOAT, [batch, channels, size, size])],
                   [helper.make_tensor_value_info(logits, FLOAT, [batch, classes])])


def mlp_mixer_block(batch: int = 2, tokens: int = 8, channels: int = 12,
                    token_hidden: int = 16, channel_hidden: int = 24,
                    seed: int = 3) -> onnx.ModelProto:
    g = _Graph("mlp_mixer_block", seed)
    x = "patches"
    h = g.layer_norm(x, channels, "token_mixing.ln")
    t = g.op("Transpose", [h], perm=[0, 2, 1])                      # [B, C, T]
    t = g.linear(g.gelu_erf(g.linear(t, tokens, token_hidden, "token_mixing.fc1")),
                 token_hidden, tokens, "token_mixing.fc2")
    x1 = g.op("Add", [x, g.op("Transpose", [t], perm=[0, 2, 1])])
    c = g.linear(g.layer_norm(x1, channels, "channel_mixing.ln"), channels, channel_hidden,
                 "channel_mixing.fc1")
    c = g.linear(g.gelu_erf(c), channel_hidden, channels, "channel_mixing.fc2")
    y = g.op("Add", [x1, c], name="mixed")
    return g.model([helper.make_tensor_value_info(x, FLOAT, [batch, tokens, channels])],
                   [helper.make_tensor_value_info(y, FLOAT, [batch, tokens, channels])])


def lstm_model(seq: int = 5, batch: int = 2, inputs: int = 4, hidden: int = 6,
               direction: str = "forward", seed: int = 4) -> onnx.ModelProto:
    g = _Graph("lstm", seed)
    dirs = 2 if direction == "bidirectional" else 1
    w = g.weight("W", [dirs, 4 * hidden, inputs], 0.4)
    r = g.weight("R", [dirs, 4 * hidden, hidden], 0.4)
    b = g.weight("B", [dirs, 8 * hidden], 0.2)
    h0 = g.weight("initial_h", [dirs, batch, hidden], 0.5)
    c0 = g.weight("initial_c", [dirs, batch, hidden], 0.5)
    outs = g.op("LSTM", ["x", w, r, b, "", h0, c0], n_out=3, name="lstm",
                hidden_size=hidden, direction=direction)
    y = g.op("Squeeze", [outs[0], g.const("axes", [1], np.int64)]) if dirs == 1 else outs[0]
    return g.model(
        [helper.make_tensor_value_info("x", FLOAT, [seq, batch, inputs])],
        [helper.make_tensor_value_info(y, FLOAT, [seq, batch, hidden] if dirs == 1 else
                                       [seq, dirs, batch, hidden]),
         helper.make_tensor_value_info(outs[1], FLOAT, [dirs, batch, hidden])])


def softmax_chain(rows: int = 6, seq: int = 5, seed: int = 5) -> onnx.ModelProto:
    """Attention's softmax alone: scores [rows, seq] (batch x heads x queries rows) scaled,
    a key mask added ([1, seq], -1e4 on the last quarter of keys), Softmax over keys."""
    g = _Graph("softmax_chain", seed)
    mask = g.const("mask", np.where(np.arange(seq) < seq - max(1, seq // 4), 0.0, -1e4)
                   .reshape(1, seq), np.float32)
    scaled = g.op("Mul", ["scores", g.const("scale", 0.125, np.float32)])
    probs = g.op("Softmax", [g.op("Add", [scaled, mask])], axis=-1, name="probs")
    return g.model([helper.make_tensor_value_info("scores", FLOAT, [rows, seq])],
                   [helper.make_tensor_value_info(probs, FLOAT, [rows, seq])])


def layer_norm_chain(tokens: int = 6, hidden: int = 10, decomposed: bool = False,
                     seed: int = 6) -> onnx.ModelProto:
    """LayerNormalization over [tokens, hidden], as the ONNX op or as the
    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add ops exporters write (opset 17)."""
    g = _Graph("layer_norm_chain", seed)
    x = "x"
    if not decomposed:
        y = g.layer_norm(x, hidden, "ln")
    else:
        gamma = g.const("ln.gamma", 1 + 0.1 * g.rng.standard_normal(hidden), np.float32)
        beta = g.const("ln.beta", 0.1 * g.rng.standard_normal(hidden), np.float32)
        mean = g.op("ReduceMean", [x], axes=[-1], keepdims=1)
        centred = g.op("Sub", [x, mean])
        square = g.op("Pow", [centred, g.const("two", 2.0, np.float32)])
        var = g.op("ReduceMean", [square], axes=[-1], keepdims=1)
        std = g.op("Sqrt", [g.op("Add", [var, g.const("eps", 1e-5, np.float32)])])
        y = g.op("Add", [g.op("Mul", [g.op("Div", [centred, std]), gamma]), beta])
    y = g.op("Identity", [y], name="normed")
    return g.model([helper.make_tensor_value_info(x, FLOAT, [tokens, hidden])],
                   [helper.make_tensor_value_info(y, FLOAT, [tokens, hidden])])


def mlp_epilogue(tokens: int = 6, d_in: int = 8, d_out: int = 12, seed: int = 7
                 ) -> onnx.ModelProto:
    """An MLP layer's epilogue after its GEMM: MatMul [tokens, d_in] x [d_in, d_out], bias,
    GELU in its erf form, a residual [tokens, d_out] added."""
    g = _Graph("mlp_epilogue", seed)
    h = g.gelu_erf(g.linear("x", d_in, d_out, "fc"))
    y = g.op("Add", [h, "residual"], name="out")
    return g.model([helper.make_tensor_value_info("x", FLOAT, [tokens, d_in]),
                    helper.make_tensor_value_info("residual", FLOAT, [tokens, d_out])],
                   [helper.make_tensor_value_info(y, FLOAT, [tokens, d_out])])


ALL = {"bert_encoder_layer": bert_encoder_layer, "gpt_block": gpt_block,
       "mobilenet_block": mobilenet_block, "mlp_mixer_block": mlp_mixer_block,
       "lstm_model": lstm_model}


def kv_cache_step(hidden: int = 8, seed: int = 1) -> onnx.ModelProto:
    """One attention head over a key/value cache: x[1, seq, hidden] and the cache past_k,
    past_v [1, past, hidden] -> k, v = the cache with this step's keys and values appended
    [1, past+seq, hidden]; position i of the step sees the cache and the step's positions up
    to its own (a mask from Range over past+seq against past + Range over seq);
    y = softmax(q k^T / sqrt hidden) v."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32),
                                     n) for n in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in
              (("zero", 0, np.int64), ("one", 1, np.int64), ("i1", [1], np.int64),
               ("scale", hidden ** -0.5, np.float32), ("ninf", -1e9, np.float32),
               ("ax0", [0], np.int64), ("ax1", [1], np.int64))]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k_new"]),
        n("MatMul", ["x", "wv"], ["v_new"]),
        n("Concat", ["past_k", "k_new"], ["k"], axis=1),
        n("Concat", ["past_v", "v_new"], ["v"], axis=1),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["raw"]), n("Mul", ["raw", "scale"], ["scores"]),
        n("Shape", ["past_k"], ["pshape"]), n("Gather", ["pshape", "i1"], ["p1"], axis=0),
        n("Shape", ["x"], ["xshape"]), n("Gather", ["xshape", "i1"], ["s1"], axis=0),
        n("Squeeze", ["p1"], ["p"]), n("Squeeze", ["s1"], ["s"]), n("Add", ["p", "s"], ["t"]),
        n("Range", ["zero", "t", "one"], ["cols"]),
        n("Range", ["zero", "s", "one"], ["steps"]), n("Add", ["steps", "p"], ["rows"]),
        n("Unsqueeze", ["rows", "ax1"], ["rows_col"]),
        n("Unsqueeze", ["cols", "ax0"], ["cols_row"]),
        n("LessOrEqual", ["cols_row", "rows_col"], ["seen"]),
        n("Where", ["seen", "scores", "ninf"], ["masked"]),
        n("Softmax", ["masked"], ["attn"], axis=-1), n("MatMul", ["attn", "v"], ["y"]),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "kv", [vi("x", FLOAT, [1, "seq", hidden]),
                      vi("past_k", FLOAT, [1, "past", hidden]),
                      vi("past_v", FLOAT, [1, "past", hidden])],
        [vi("y", FLOAT, [1, "seq", hidden]), vi("k", FLOAT, None), vi("v", FLOAT, None)],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8   # as the other builders: loads in older onnxruntime releases too
    return model


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of the batch-1 `model` at batch `batch`: the first dimension of its graph inputs
    (those without an initializer) and outputs, and the leading 1 of every constant Reshape
    target applied to a tensor computed from the inputs (the bundled models flatten with
    targets such as [1, 2048]; ShuffleNet's channel shuffle reshapes to [1, 4, 28, 56, 56]).
    Reshapes of weights keep their targets. Intermediate shapes (value_info) are dropped."""
    model = copy.deepcopy(model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    live = {vi.name for vi in g.input if vi.name not in inits}
    for node in g.node:
        if any(name in live for name in node.input):
            live.update(node.output)
    for node in g.node:
        if node.op_type != "Reshape" or node.input[0] not in live:
            continue
        if node.input[1] not in inits:
            raise ValueError(f"Reshape {node.name or node.output[0]}: the target shape is not "
                             "a constant, so its batch dimension cannot be rewritten")
        target = numpy_helper.to_array(inits[node.input[1]])
        if target[0] in (0, -1):
            continue
        if target[0] != 1:
            raise ValueError(f"Reshape {node.name or node.output[0]}: target {target.tolist()} "
                             "does not start with the batch-1 dimension")
        name = f"{node.input[1]}_batch{batch}"
        if name not in inits:
            inits[name] = numpy_helper.from_array(
                np.concatenate([[batch], target[1:]]).astype(target.dtype), name)
            g.initializer.append(inits[name])
            if model.ir_version < 4:  # IR version 3 declares every initializer as an input
                g.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(target.dtype), [target.size]))
        node.input[1] = name
    for vi in list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in inits and dims:
            dims[0].dim_value = batch
    del g.value_info[:]
    onnx.checker.check_model(model)
    return model
