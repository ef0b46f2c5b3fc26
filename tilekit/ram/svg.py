"""The picture of a program: vEUs (rows) over estimated time (columns), one SVG file.

What a reader sees, top to bottom:

- the title (model, policy, hardware) and a wrapped subtitle with the estimates (makespan,
  serial policy, one kernel per operator), the segments, rTasks, vEUs and the launch overhead;
- a key whose swatches are the colours drawn: rTasks are **coloured by operator kind**
  (contraction, reduction, elementwise, opaque, other; from the module's ops, a fused group
  by its heaviest member), in two shades that alternate between neighbouring operators of a
  kind so that their boundary shows; the launch gap, the barrier tick, the idle wait;
- the plot: every vEU a row (all of them: the row height shrinks to fit, down to 1 px, and
  the picture grows beyond that), every segment after the previous one, separated by its
  kernel launch. Launches are drawn as narrow hatched bands of fixed width, not to scale (the
  time axis is broken there, marked `//` on the axis): at 4 us each they would otherwise
  hide segments a fraction of that long. Segment boundaries are vertical lines with the
  segment's number above (`S0`, `S1`, ...); an ordinary-kernel segment is one box over all
  rows;
- the time axis: ticks with labels in microseconds of estimated time (launches included)
  inside each segment, at a step that keeps labels apart;
- one line per segment below the axis: its kind, operators, vEUs, threads and times.

Hover: every rTask box (up to `PER_TASK_TITLES` of them; beyond that one shape per operator
and segment) has a `<title>` with its operator, its kernel group, its rTasks, its vEU and its
start and end; a kernel segment and each segment label have theirs.

Output is deterministic: coordinates printed with one decimal, elements in a fixed order.
"""

from __future__ import annotations

import math
import textwrap
from html import escape
from typing import Mapping

from tilekit.ir.model import Module
from tilekit.ir.program import Program
from tilekit.ram.timeline import simulate

WIDTH = 1200
LEFT = 64
RIGHT = 16
#: The height the rows share when they can (more vEUs shrink the rows down to `MIN_ROW`).
PLOT_HEIGHT = 480.0
MIN_ROW, MAX_ROW = 1.0, 8.0
#: A kernel launch is drawn this wide, whatever it lasts (the axis is broken there).
GAP = 14.0
#: The narrowest a segment is drawn.
MIN_SEGMENT = 3.0
#: Ticks on the time axis are at least this far apart.
TICK_SPACING = 70.0
#: Above this many rTask boxes, one shape per operator and segment carries the hover text.
PER_TASK_TITLES = 20000
LINE = 14.0
#: Segments listed below the axis (the others say what they are on hover).
MAX_LISTED = 40

#: Operator kinds, in the key's order, with their two shades.
KINDS: dict[str, tuple[str, str, str]] = {
    "contraction": ("#2f6fa8", "#7fb1dc", "contraction (convolution, matrix product)"),
    "reduction": ("#c2571a", "#f0a264", "reduction (sum, max, pooling, softmax parts)"),
    "elementwise": ("#3b8a3b", "#8fcf84", "elementwise and data movement"),
    "opaque": ("#7a4f9a", "#c4a3dc", "opaque (gather, resize, ...)"),
    "other": ("#7d7d7d", "#bdbdbd", "other"),
}
BARRIER = "#d62728"


def _f(x: float) -> str:
    return f"{x:.1f}"


def _us(x: float) -> str:
    return f"{x:.4g}"


def operator_kinds(module: Module, program: Program) -> dict[int, str]:
    """Each operator's kind (a key of `KINDS`) from the module's ops: a group of several ops
    (tk-weld's) takes the heaviest of its members' kinds."""
    from tilekit.ir.graph import op_analysis

    index = module.op_index()
    groups = {k.name: k.ops for k in module.kernels}
    rank = list(KINDS)
    out: dict[int, str] = {}
    for i, op in enumerate(program.operators):
        kinds = []
        for name in groups.get(op.kernel, ()):
            k = index.get(name)
            if k is None:
                continue
            member = module.ops[k]
            if member.kind == "opaque":
                kinds.append("opaque")
            elif member.kind != "expr":
                kinds.append("other")
            else:
                try:
                    a = op_analysis(module, k)
                except Exception:  # noqa: BLE001 - the picture never fails on an odd op
                    kinds.append("other")
                    continue
                if a.reduction and a.assign == "+=" and len(a.inputs) >= 2:
                    kinds.append("contraction")
                elif a.reduction:
                    kinds.append("reduction")
                else:
                    kinds.append("elementwise")
        out[i] = min(kinds, key=rank.index) if kinds else "other"
    return out


def _nice_step(span: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at least `span`."""
    if span <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(span))
    for m in (1, 2, 5, 10):
        if m * power >= span:
            return m * power
    return 10 * power  # pragma: no cover


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0


def render(program: Program, module: Module) -> str:
    """The SVG text of `program`, planned for `module` (see the module docstring)."""
    timeline = simulate(program)
    kinds = operator_kinds(module, program)
    launch = program.launch_us
    lengths = timeline.segment_us
    nseg = len(program.segments)
    total = sum(lengths) + launch * nseg
    most = max([s.veus for s in program.segments] + [1])
    row = min(MAX_ROW, max(MIN_ROW, PLOT_HEIGHT / most))
    est = program.estimate

    # -- text above the plot: title, wrapped subtitle, key ----------------------------------
    title = f"{module.model}: {program.policy} policy on {program.hardware}"
    subtitle = (f"Estimated makespan {est.get('makespan_us', _us(total))} us (serial policy "
                f"{est.get('serial_us', '?')} us; one kernel per operator "
                f"{est.get('per_op_kernels_us', '?')} us). {nseg} segments "
                f"({est.get('persistent_segments', '?')} persistent), {program.tasks} rTasks "
                f"of {len(program.operators)} operators on up to {most} vEUs (all drawn, one "
                f"row each). Kernel launch overhead {launch} us per segment "
                f"({program.launch_source}).")
    lines = textwrap.wrap(subtitle, 185)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="HEIGHT" '
           f'viewBox="0 0 {WIDTH} HEIGHT" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           '<defs><pattern id="launch" width="4" height="4" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="4" height="4" fill="#f2f2f2"/>'
           '<line x1="0" y1="0" x2="0" y2="4" stroke="#b0b0b0" stroke-width="1.5"/>'
           "</pattern></defs>",
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    y = 20.0
    for text in lines:
        y += LINE
        out.append(f'<text x="{LEFT}" y="{_f(y)}">{escape(text)}</text>')
    y += LINE + 4
    present = [k for k in KINDS if k in kinds.values()]
    out.append(f'<text x="{LEFT}" y="{_f(y)}" font-weight="bold">Key</text>')
    x = LEFT + 34.0
    out.append(f'<text x="{_f(x)}" y="{_f(y)}">rTasks coloured by operator kind; two shades '
               "alternate between neighbouring operators of a kind. Hover a box for its "
               "operator, rTasks, vEU and times.</text>")
    y += LINE + 2
    x = float(LEFT)
    for k in present:
        dark, light, label = KINDS[k]
        out.append(f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="10" height="10" fill="{dark}"/>')
        out.append(f'<rect x="{_f(x + 11)}" y="{_f(y - 9)}" width="10" height="10" '
                   f'fill="{light}"/>')
        out.append(f'<text x="{_f(x + 25)}" y="{_f(y)}">{escape(label)}</text>')
        x += 25 + 6.2 * len(label) + 18
    y += LINE + 2
    x = float(LEFT)
    broken, gaps, widths = _layout(lengths, launch, WIDTH - LEFT - RIGHT)
    launch_text = (f"kernel launch between segments ({launch} us each; drawn "
                   f"{gaps[0] if gaps else GAP:.3g} px wide, not to scale: the time axis is "
                   "broken there, //)" if broken else
                   f"kernel launch between segments ({launch} us each, to scale)")
    legend = [
        (lambda x: f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="{_f(GAP)}" height="10" '
                   'fill="url(#launch)" stroke="#999999" stroke-width="0.5"/>',
         launch_text, GAP),
        (lambda x: f'<path d="M{_f(x + 4)} {_f(y - 10)}v11" stroke="{BARRIER}" '
                   'stroke-width="1.5"/>', "barrier: a vEU's wait released", 8.0),
        (lambda x: f'<path d="M{_f(x)} {_f(y - 4)}h14" stroke="{BARRIER}" stroke-width="1" '
                   'stroke-dasharray="2,1"/>', "a vEU idle at a wait", 14.0),
        (lambda x: f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="12" height="10" '
                   'fill="#dddddd" stroke="#555555" stroke-width="0.5"/>',
         "an ordinary kernel (a segment of one operator, drawn over all rows, in its kind's "
         "colour)", 12.0),
    ]
    for shape, label, width in legend:
        if x + width + 4 + 6.0 * len(label) > WIDTH - RIGHT:
            x = float(LEFT)
            y += LINE + 2
        out.append(shape(x))
        out.append(f'<text x="{_f(x + width + 4)}" y="{_f(y)}">{escape(label)}</text>')
        x += width + 4 + 6.0 * len(label) + 20
    top = y + LINE + 18  # room for the segment labels above the plot

    # -- the plot: launches and segments --------------------------------------------------
    height = most * row
    plot = []
    x = float(LEFT)
    t = 0.0
    marks = []  # (segment, x0, width, t0)
    for s, (seg, line) in enumerate(zip(program.segments, timeline.segments)):
        plot.append(f'<rect class="launch" x="{_f(x)}" y="{_f(top)}" width="{_f(gaps[s])}" '
                    f'height="{_f(height)}" fill="url(#launch)"><title>kernel launch before '
                    f"segment {s}: {launch} us{' (not to scale)' if broken else ''}</title>"
                    "</rect>")
        x += gaps[s]
        t += launch
        marks.append((s, x, widths[s], t))
        scale = widths[s] / line.length_us if line.length_us > 0 else 0.0
        if seg.kind == "kernel":
            op = seg.operators[0]
            kind = kinds.get(op, "other")
            o = program.operators[op]
            plot.append(f'<rect class="kernel" data-op="{op}" x="{_f(x)}" y="{_f(top)}" '
                        f'width="{_f(widths[s])}" height="{_f(height)}" '
                        f'fill="{KINDS[kind][0]}" fill-opacity="0.35" stroke="#555555" '
                        f'stroke-width="0.5"><title>{escape(o.kernel)}: an ordinary kernel '
                        f"({kind}), {o.tasks} blocks, {_us(t)}-{_us(t + line.length_us)} us"
                        "</title></rect>")
        else:
            plot.extend(_tasks(program, line, kinds, x, top, row, scale, t,
                               sum(len(s_.boxes) for s_ in timeline.segments)))
            plot.extend(_barriers(line, x, top, row, scale))
        x += widths[s]
        t += line.length_us
    right = x

    # -- segment boundaries and labels (a label too close to the previous one is left out;
    # its segment still says what it is on hover, and in the list below) ----------------
    last_label = -1e9
    for s, x0, w, t0 in marks:
        seg = program.segments[s]
        plot.append(f'<path class="segment" d="M{_f(x0)} {_f(top - 4)}v{_f(height + 8)}'
                    f'M{_f(x0 + w)} {_f(top - 4)}v{_f(height + 8)}" stroke="#333333" '
                    'stroke-width="0.6"/>')
        what = (f"persistent, {len(seg.operators)} operators on {seg.veus} vEUs"
                if seg.kind == "persistent" else
                f"ordinary kernel {program.operators[seg.operators[0]].kernel}")
        hover = f"<title>segment S{s}: {escape(what)}, {_us(t0)}-{_us(t0 + lengths[s])} us</title>"
        plot.append(f'<rect class="segment-hover" x="{_f(x0)}" y="{_f(top - 16)}" '
                    f'width="{_f(max(w, 1.0))}" height="12" fill="white" fill-opacity="0">'
                    f"{hover}</rect>")
        label = f"S{s}"
        if x0 + w / 2 - last_label >= 8 + 6 * len(label):
            plot.append(f'<text class="segment-label" x="{_f(x0 + w / 2)}" y="{_f(top - 7)}" '
                        f'text-anchor="middle" font-size="10">{label}{hover}</text>')
            last_label = x0 + w / 2

    # -- the vEU axis -----------------------------------------------------------------------
    plot.append(f'<text x="14" y="{_f(top + height / 2)}" transform="rotate(-90 14 '
                f'{_f(top + height / 2)})" text-anchor="middle">vEU</text>')
    vstep = max(1, int(_nice_step(16.0 / row)))
    for v in range(0, most, vstep):
        yv = top + v * row + row / 2
        plot.append(f'<text x="{LEFT - 4}" y="{_f(yv + 3)}" text-anchor="end" '
                    f'font-size="9">{v}</text>')

    # -- the time axis: ticks inside the segments, breaks at narrow launches ----------------
    axis_y = top + height + 8
    plot.append(f'<path class="axis" d="M{LEFT} {_f(axis_y)}H{_f(right)}" stroke="black"/>')
    scales = [w / lengths[s] for s, _, w, _ in marks if lengths[s] > 0 and w > MIN_SEGMENT]
    px_per_us = max(scales, default=0.0)
    step = _nice_step(TICK_SPACING / px_per_us) if px_per_us > 0 else 1.0
    digits = _decimals(step)
    last_tick, last_k = -1e9, -1
    spans = []  # (x0, width, t0, length) of what the axis measures: launches when to scale
    for s, x0, w, t0 in marks:
        if broken:
            plot.append(f'<path class="break" d="M{_f(x0 - gaps[s] / 2 - 4)} '
                        f'{_f(axis_y + 4)}l4 -8M{_f(x0 - gaps[s] / 2)} {_f(axis_y + 4)}l4 -8" '
                        'stroke="black"/>')
        else:
            spans.append((x0 - gaps[s], gaps[s], t0 - launch, launch))
        spans.append((x0, w, t0, lengths[s]))
    for x0, w, t0, length in spans:
        if length <= 0:
            continue
        k = max(math.ceil(t0 / step - 1e-9), last_k + 1)
        while k * step <= t0 + length + 1e-9:
            last_k = k
            xt = x0 + (k * step - t0) / length * w
            plot.append(f'<path d="M{_f(xt)} {_f(axis_y)}v5" stroke="black"/>')
            if xt - last_tick >= 0.8 * TICK_SPACING:
                plot.append(f'<text x="{_f(xt)}" y="{_f(axis_y + 16)}" text-anchor="middle" '
                            f'font-size="10">{k * step:.{digits}f}</text>')
                last_tick = xt
            k += 1
    plot.append(f'<text x="{_f(WIDTH - RIGHT)}" y="{_f(axis_y + 30)}" text-anchor="end">'
                f"estimated time (us), launches included; the whole program {_us(total)} us"
                "</text>")

    # -- one line per segment ---------------------------------------------------------------
    y = axis_y + 50
    plot.append(f'<text x="{LEFT}" y="{_f(y)}" font-weight="bold">Segments</text>')
    for s, x0, w, t0 in marks[:MAX_LISTED]:
        y += LINE
        seg = program.segments[s]
        names = [program.operators[o].kernel for o in seg.operators]
        shown = ", ".join(names[:4]) + (f", ... ({len(names)})" if len(names) > 4 else "")
        if seg.kind == "persistent":
            what = (f"persistent kernel: {len(names)} operators on {seg.veus} vEUs of "
                    f"{seg.threads} threads")
        else:
            what = "ordinary kernel"
        plot.append(f'<text x="{LEFT}" y="{_f(y)}">S{s}  {_us(t0)}-{_us(t0 + lengths[s])} us  '
                    f"{escape(what)}: {escape(shown)}</text>")
    if len(marks) > MAX_LISTED:
        y += LINE
        plot.append(f'<text x="{LEFT}" y="{_f(y)}">... and {len(marks) - MAX_LISTED} more '
                    "segments (hover a segment's label above the plot)</text>")
    full = y + 16
    out.extend(plot)
    out.append("</svg>")
    text = "\n".join(out) + "\n"
    return text.replace('height="HEIGHT"', f'height="{_f(full)}"', 1).replace(
        "0 0 1200 HEIGHT", f"0 0 {WIDTH} {_f(full)}", 1)


def _layout(lengths: list[float], launch: float, avail: float
            ) -> tuple[bool, list[float], list[float]]:
    """(broken, launch widths, segment widths). Launches are drawn to scale when they take at
    most a quarter of the program; otherwise each is a fixed narrow band (the axis is broken
    there) and the segments share the rest on one scale."""
    n = len(lengths)
    total = sum(lengths) + launch * n
    if n == 0:
        return False, [], []
    if launch * n <= 0.25 * total:
        spans = [x for length in lengths for x in (launch, length)]
        mins = [(1.0 if launch > 0 else 0.0) if i % 2 == 0 else MIN_SEGMENT
                for i in range(2 * n)]
        w = _widths(spans, mins, avail)
        return False, w[0::2], w[1::2]
    gap = min(GAP, 0.25 * avail / n)
    return True, [gap] * n, _widths(lengths, [MIN_SEGMENT] * n, avail - gap * n)


def _widths(lengths: list[float], mins: list[float], avail: float) -> list[float]:
    """Widths in `avail` on one scale, each at least its minimum (those drawn at their
    minimum leave the rest to the others)."""
    small: set[int] = set()
    scale = 0.0
    for _ in range(len(lengths) + 1):
        rest = sum(length for i, length in enumerate(lengths) if i not in small)
        room = avail - sum(mins[i] for i in small)
        scale = room / rest if rest > 0 else 0.0
        newly = {i for i, length in enumerate(lengths)
                 if i not in small and length * scale < mins[i]}
        if not newly:
            break
        small |= newly
    return [mins[i] if i in small else length * scale for i, length in enumerate(lengths)]


def _shade(program: Program, kinds: Mapping[int, str], op: int) -> str:
    """The operator's colour: its kind's, in the shade that alternates with the previous
    operator of the same kind in its segment."""
    kind = kinds.get(op, "other")
    seg = program.segments[program.operators[op].segment]
    same = [o for o in seg.operators if kinds.get(o, "other") == kind]
    dark, light, _ = KINDS[kind]
    return dark if same.index(op) % 2 == 0 else light


def _tasks(program: Program, line, kinds, x: float, top: float, row: float, scale: float,
           t0: float, boxes_in_program: int) -> list[str]:
    """The segment's rTask boxes: one `<rect>` with its hover text each, or, for a program of
    more than `PER_TASK_TITLES` boxes, one path per operator with the operator's."""
    out = []
    h = max(row * 0.9, 0.6) if row > 1.5 else row
    if boxes_in_program <= PER_TASK_TITLES:
        for box in line.boxes:
            o = program.operators[box.op]
            last = box.first + box.count - 1
            tasks = f"rTask {box.first}" if box.count == 1 else f"rTasks {box.first}-{last}"
            out.append(f'<rect class="rtask" data-op="{box.op}" x="{_f(x + box.start * scale)}" '
                       f'y="{_f(top + box.veu * row)}" '
                       f'width="{_f(max((box.end - box.start) * scale, 0.3))}" '
                       f'height="{_f(h)}" fill="{_shade(program, kinds, box.op)}"><title>'
                       f"{escape(o.kernel)} ({kinds.get(box.op, 'other')}): {tasks} of "
                       f"{o.tasks} on vEU {box.veu}, {_us(t0 + box.start)}-"
                       f"{_us(t0 + box.end)} us</title></rect>")
        return out
    by_op: dict[int, list[str]] = {}
    span: dict[int, tuple[float, float]] = {}
    for box in line.boxes:
        by_op.setdefault(box.op, []).append(
            f"M{_f(x + box.start * scale)} {_f(top + box.veu * row)}"
            f"h{_f(max((box.end - box.start) * scale, 0.3))}v{_f(h)}H"
            f"{_f(x + box.start * scale)}z")
        lo, hi = span.get(box.op, (box.start, box.end))
        span[box.op] = (min(lo, box.start), max(hi, box.end))
    for op in sorted(by_op):
        o = program.operators[op]
        lo, hi = span[op]
        out.append(f'<path class="rtasks" data-op="{op}" fill="{_shade(program, kinds, op)}" '
                   f'd="{"".join(by_op[op])}"><title>{escape(o.kernel)} '
                   f"({kinds.get(op, 'other')}): {o.tasks} rTasks, {_us(t0 + lo)}-"
                   f"{_us(t0 + hi)} us</title></path>")
    return out


def _barriers(line, x: float, top: float, row: float, scale: float) -> list[str]:
    """A tick where each wait releases; a dashed line while its vEU idles."""
    ticks, idle = [], []
    for bar in line.barriers:
        end = _f(x + bar.end * scale)
        ticks.append(f"M{end} {_f(top + bar.veu * row)}v{_f(max(row * 0.9, 0.6))}")
        if bar.end > bar.start:
            idle.append(f"M{_f(x + bar.start * scale)} {_f(top + bar.veu * row + row * 0.45)}"
                        f"H{end}")
    out = []
    if ticks:
        out.append(f'<path class="barriers" stroke="{BARRIER}" stroke-width="0.8" fill="none" '
                   f'd="{"".join(ticks)}"/>')
    if idle:
        out.append(f'<path class="waits" stroke="{BARRIER}" stroke-width="0.5" '
                   f'stroke-dasharray="2,1" fill="none" d="{"".join(idle)}"/>')
    return out


__all__ = ["KINDS", "operator_kinds", "render"]
