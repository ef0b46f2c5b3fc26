"""Recurrent ops (LSTM, GRU, RNN), unrolled over their static sequence length.

Decomposition (per direction):

1. the input projection of every time step at once, one matmul statement:
   `xw[t, b, g] += x[t, b, k] * W[d, g, k]`;
2. per time step: the recurrent projection `hr[b, g] += h_prev[b, k] * R[d, g, k]` (skipped at
   the first step when the initial state is zero), then elementwise statements for the cell
   (LSTM: `c` then `h`; GRU: reset gate, `(r*h_prev) R`, then `h`; RNN: `h`);
3. Y as one statement selecting the step's hidden state by `t` (and direction);
   Y_h / Y_c are the last step's states.

Biases `Wb + Rb` are summed at import. Everything is a tensor expression, so later stages can
fuse a step's ops and schedule the small per-step kernels (the Rammer case). `sequence_lens`
is accepted when it is constant and equal to the full length for every batch entry.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter

#: Activation templates over `{x}` (`{a}`, `{b}`: activation_alpha/beta values).
_ACTIVATIONS = {
    "Sigmoid": ("sigmoid({x})", 0), "Tanh": ("tanh({x})", 0), "Relu": ("max({x}, 0)", 0),
    "Softsign": ("{x} / (1 + abs({x}))", 0),
    "Softplus": ("max({x}, 0) + log(1 + exp(-abs({x})))", 0),
    "LeakyRelu": ("select({x} > 0, {x}, {x} * {a})", 1),
    "ThresholdedRelu": ("select({x} > {a}, {x}, 0)", 1),
    "Elu": ("select({x} > 0, {x}, {a} * (exp({x}) - 1))", 1),
    "HardSigmoid": ("max(0, min(1, {a} * {x} + {b}))", 2),
    "ScaledTanh": ("{a} * tanh({b} * {x})", 2), "Affine": ("{a} * {x} + {b}", 2),
}
_DEFAULT_PARAMS = {"LeakyRelu": (0.01,), "ThresholdedRelu": (1.0,), "Elu": (1.0,),
                   "HardSigmoid": (0.2, 0.5), "ScaledTanh": (1.0, 1.0), "Affine": (1.0, 0.0)}


StateRead = Callable[[str], str]
"""Text reading a [batch, hidden] state at hidden-unit axis `a` (`h` elementwise, `k` in a
matmul)."""


class _Recurrence:
    """What LSTM, GRU and RNN share: inputs, directions, projections, outputs."""

    def __init__(self, ctx: NodeContext, gates: int, default_acts: Sequence[str]):
        self.ctx = ctx
        self.x, self.w, self.r = ctx.input(0), ctx.input(1), ctx.input(2)
        self.hidden = int(ctx.attr("hidden_size") or self.r.shape[-1])
        self.layout = int(ctx.attr("layout", 0))
        direction = ctx.attr("direction", "forward")
        self.dirs = {"forward": [False], "reverse": [True],
                     "bidirectional": [False, True]}.get(direction)
        if self.dirs is None:
            raise ctx.unsupported(f"direction='{direction}'")
        self.steps = self.x.shape[1] if self.layout else self.x.shape[0]
        self.batch = self.x.shape[0] if self.layout else self.x.shape[1]
        self.dtype = self.x.dtype
        self.gates = gates
        self.clip = ctx.attr("clip")
        self.acts = self._activations(default_acts)
        lens = ctx.const(4) if ctx.has_input(4) else None
        if ctx.has_input(4) and (lens is None or np.any(lens != self.steps)):
            raise ctx.unsupported("sequence_lens shorter than the sequence",
                                  "only full-length sequences are supported")

    def _activations(self, default: Sequence[str]) -> list:
        ctx = self.ctx
        names = ctx.attr("activations") or list(default) * len(self.dirs)
        alphas = list(ctx.attr("activation_alpha") or [])
        betas = list(ctx.attr("activation_beta") or [])
        acts = []
        for name in names:
            key = next((k for k in _ACTIVATIONS if k.lower() == str(name).lower()), None)
            if key is None:
                raise ctx.unsupported(f"activation '{name}'",
                                      f"supported: {', '.join(sorted(_ACTIVATIONS))}")
            template, nparams = _ACTIVATIONS[key]
            params = list(_DEFAULT_PARAMS.get(key, ()))
            if nparams >= 1 and alphas:
                params[0] = alphas.pop(0)
            if nparams >= 2 and betas:
                params[1] = betas.pop(0)
            acts.append((template, params))
        per = len(default)
        return [acts[k * per:(k + 1) * per] for k in range(len(self.dirs))]

    def act(self, d: int, which: int, x: str) -> str:
        template, params = self.acts[d][which]
        values = [text.literal(p, self.dtype) for p in params] + ["", ""]
        return text.atom(template.format(x=text.atom(x), a=values[0], b=values[1]))

    def clipped(self, pre: str) -> str:
        if self.clip is None:
            return pre
        c = text.literal(self.clip, self.dtype)
        return f"min(max({pre}, -{c}), {c})"

    def tag(self, kind: str, d: int, s: int | None = None) -> str:
        """Step names: `h3` (one direction) or `h3_d1`; `xw`, `xw_d1`."""
        base = kind if s is None else f"{kind}{s}"
        return base if len(self.dirs) == 1 else f"{base}_d{d}"

    def input_projection(self, d: int) -> Value:
        """xw[t, b, g] for all steps: one matmul statement."""
        ctx = self.ctx
        tag = self.tag("xw", d)
        xw = ctx.temp(tag, (self.steps, self.batch, self.gates * self.hidden), self.dtype)
        xi = ["b", "t", "k"] if self.layout else ["t", "b", "k"]
        ctx.assign(xw, ["t", "b", "g"], "+=",
                   f"{ctx.access(self.x, xi)} * {ctx.access(self.w, [str(d), 'g', 'k'])}",
                   step=tag)
        return xw

    def xw_at(self, xw: Value, t: int, gate: int) -> str:
        return self.ctx.access(xw, [str(t), "b", text.term([("h", 1)], gate * self.hidden)])

    def summed_bias(self, d: int) -> StateRead | None:
        """Wb + Rb of direction d as a reader over gate-row offsets (summed at import when
        constant)."""
        ctx, b = self.ctx, self.ctx.input(3)
        if b is None:
            return None
        n = self.gates * self.hidden
        if b.const is not None:
            summed = ctx.weight(self.tag("bias", d), b.const[d, :n] + b.const[d, n:])
            return lambda row: ctx.access(summed, [row])
        return lambda row: (f"{ctx.access(b, [str(d), row])} + "
                            f"{ctx.access(b, [str(d), _shift(row, n)])}")

    def bias_part(self, d: int, offset: int) -> str:
        """` + B[d, h + offset]` (GRU keeps Wb and Rb apart), or nothing."""
        b = self.ctx.input(3)
        if b is None:
            return ""
        return f" + {self.ctx.access(b, [str(d), text.term([('h', 1)], offset)])}"

    def initial(self, index: int, d: int) -> StateRead | None:
        """The initial state (`initial_h`/`initial_c`), or None when it is zero."""
        v = self.ctx.input(index)
        if v is None:
            return None
        return lambda a: self.ctx.access(v, ["b", str(d), a] if self.layout else
                                         [str(d), "b", a])

    def reader(self, v: Value) -> StateRead:
        return lambda a: self.ctx.access(v, ["b", a])

    def recurrent_projection(self, d: int, s: int, h_prev: StateRead, rows: int,
                             row_offset: int = 0, kind: str = "hr",
                             gate: StateRead | None = None) -> Value:
        """`hr[b, g] += h_prev[b, k] * R[d, g + offset, k]` for one step (`gate[b, k]` times
        the state when given: GRU's reset gate)."""
        ctx = self.ctx
        tag = self.tag(kind, d, s)
        hr = ctx.temp(tag, (self.batch, rows), self.dtype)
        state = h_prev("k") if gate is None else f"{gate('k')} * {h_prev('k')}"
        row = text.term([("g", 1)], row_offset)
        ctx.assign(hr, ["b", "g"], "+=", f"{state} * {ctx.access(self.r, [str(d), row, 'k'])}",
                   step=tag)
        return hr

    def state(self, kind: str, d: int, s: int, body: str) -> Value:
        tag = self.tag(kind, d, s)
        v = self.ctx.temp(tag, (self.batch, self.hidden), self.dtype)
        self.ctx.assign(v, ["b", "h"], "=", body, step=tag)
        return v

    def outputs(self, hs: list[list[Value]], cs: list[list[Value]] | None) -> None:
        """Y (all steps, time order), Y_h and Y_c (the last step of each direction)."""
        ctx = self.ctx
        if ctx.output_used(0):
            y = ctx.output(0)
            ax = ["b", "t", "d", "h"] if self.layout else ["t", "d", "b", "h"]
            per_dir = []
            for d, reverse in enumerate(self.dirs):
                by_time = list(reversed(hs[d])) if reverse else hs[d]
                per_dir.append(text.select_by_range(
                    "t", list(range(len(by_time))),
                    [ctx.access(h, ["b", "h"]) for h in by_time]))
            body = per_dir[-1]
            if len(per_dir) == 2:
                body = f"select(d == 0, {per_dir[0]}, {per_dir[1]})"
            ctx.assign(y, ax, "=", body, step="y")
        for index, states in ((1, hs), (2, cs)):
            if states is None or not ctx.output_used(index):
                continue
            out = ctx.output(index)
            ax = ["b", "d", "h"] if self.layout else ["d", "b", "h"]
            last = [ctx.access(st[-1], ["b", "h"]) for st in states]
            body = last[0] if len(last) == 1 else f"select(d == 0, {last[0]}, {last[1]})"
            ctx.assign(out, ax, "=", body, step="y_h" if index == 1 else "y_c")


def _shift(row: str, offset: int) -> str:
    return f"{row} + {offset}"


@converter("LSTM", summary="unrolled: xw matmul; per step hr matmul, c and h statements")
def lstm(ctx: NodeContext) -> None:
    rec = _Recurrence(ctx, 4, ("Sigmoid", "Tanh", "Tanh"))
    input_forget = ctx.attr("input_forget", 0)
    peep = ctx.input(7)
    hsize = rec.hidden
    all_h, all_c = [], []
    for d, reverse in enumerate(rec.dirs):
        xw = rec.input_projection(d)
        bias = rec.summed_bias(d)
        h_prev, c_prev = rec.initial(5, d), rec.initial(6, d)
        hs, cs = [], []
        for s in range(rec.steps):
            t = rec.steps - 1 - s if reverse else s
            hr = None if h_prev is None else rec.recurrent_projection(d, s, h_prev, 4 * hsize)

            def pre(gate: int, peephole: int | None = None, cell: str | None = None) -> str:
                row = text.term([("h", 1)], gate * hsize)
                body = rec.xw_at(xw, t, gate)
                if hr is not None:
                    body += f" + {ctx.access(hr, ['b', row])}"
                if bias is not None:
                    body += f" + {bias(row)}"
                if peep is not None and cell is not None:
                    p_row = text.term([("h", 1)], peephole)
                    body += f" + {ctx.access(peep, [str(d), p_row])} * {cell}"
                return rec.clipped(body)

            c_old = None if c_prev is None else c_prev("h")
            i_gate = rec.act(d, 0, pre(0, 0, c_old))
            g_gate = rec.act(d, 1, pre(3))
            f_gate = f"(1 - {i_gate})" if input_forget else rec.act(d, 0, pre(2, 2 * hsize, c_old))
            body = f"{i_gate} * {g_gate}"
            if c_old is not None:
                body = f"{f_gate} * {c_old} + {body}"
            c = rec.state("c", d, s, body)
            c_now = ctx.access(c, ["b", "h"])
            o_gate = rec.act(d, 0, pre(1, hsize, c_now))
            h = rec.state("h", d, s, f"{o_gate} * {rec.act(d, 2, c_now)}")
            h_prev, c_prev = rec.reader(h), rec.reader(c)
            hs.append(h)
            cs.append(c)
        all_h.append(hs)
        all_c.append(cs)
    rec.outputs(all_h, all_c)


@converter("GRU", summary="unrolled: xw matmul; per step hr matmul, reset gate, (r*h)R "
                          "matmul, h statement")
def gru(ctx: NodeContext) -> None:
    rec = _Recurrence(ctx, 3, ("Sigmoid", "Tanh"))
    lbr = ctx.attr("linear_before_reset", 0)
    hsize = rec.hidden
    all_h = []
    for d, reverse in enumerate(rec.dirs):
        xw = rec.input_projection(d)
        h_prev = rec.initial(5, d)
        hs = []
        for s in range(rec.steps):
            t = rec.steps - 1 - s if reverse else s
            hr = None if h_prev is None else rec.recurrent_projection(
                d, s, h_prev, (3 if lbr else 2) * hsize)

            def gate_pre(gate: int) -> str:
                body = rec.xw_at(xw, t, gate)
                if hr is not None:
                    body += f" + {ctx.access(hr, ['b', text.term([('h', 1)], gate * hsize)])}"
                return rec.clipped(body + rec.bias_part(d, gate * hsize)
                                   + rec.bias_part(d, (3 + gate) * hsize))

            z = rec.act(d, 0, gate_pre(0))
            r_gate = rec.act(d, 0, gate_pre(1))
            if lbr:
                recur = "0" if hr is None else \
                    ctx.access(hr, ["b", text.term([("h", 1)], 2 * hsize)])
                inner = f"{r_gate} * ({recur}{rec.bias_part(d, 5 * hsize)})"
                cand = rec.act(d, 1, rec.clipped(
                    f"{rec.xw_at(xw, t, 2)} + {inner}{rec.bias_part(d, 2 * hsize)}"))
            else:
                recur = ""
                if h_prev is not None:
                    r = rec.state("r", d, s, r_gate)
                    rh = rec.recurrent_projection(d, s, h_prev, hsize, 2 * hsize, kind="rh",
                                                  gate=rec.reader(r))
                    recur = f" + {ctx.access(rh, ['b', 'h'])}"
                cand = rec.act(d, 1, rec.clipped(
                    f"{rec.xw_at(xw, t, 2)}{recur}{rec.bias_part(d, 2 * hsize)}"
                    f"{rec.bias_part(d, 5 * hsize)}"))
            body = f"(1 - {z}) * {cand}"
            if h_prev is not None:
                body += f" + {z} * {h_prev('h')}"
            h = rec.state("h", d, s, body)
            h_prev = rec.reader(h)
            hs.append(h)
        all_h.append(hs)
    rec.outputs(all_h, None)


@converter("RNN", summary="unrolled: xw matmul; per step hr matmul, h = f(xw + hr + b)")
def rnn(ctx: NodeContext) -> None:
    rec = _Recurrence(ctx, 1, ("Tanh",))
    all_h = []
    for d, reverse in enumerate(rec.dirs):
        xw = rec.input_projection(d)
        bias = rec.summed_bias(d)
        h_prev = rec.initial(5, d)
        hs = []
        for s in range(rec.steps):
            t = rec.steps - 1 - s if reverse else s
            body = rec.xw_at(xw, t, 0)
            if h_prev is not None:
                hr = rec.recurrent_projection(d, s, h_prev, rec.hidden)
                body += f" + {ctx.access(hr, ['b', 'h'])}"
            if bias is not None:
                body += f" + {bias('h')}"
            h = rec.state("h", d, s, rec.act(d, 0, rec.clipped(body)))
            h_prev = rec.reader(h)
            hs.append(h)
        all_h.append(hs)
    rec.outputs(all_h, None)
