"""The picture of a program: vEUs (rows) over estimated time (columns), one SVG file.

Every segment is drawn after the previous one on one time axis (kernel launches between them
as grey gaps of the launch overhead). In a persistent segment each rTask is a box on its vEU
row, coloured by operator (a fixed palette indexed by operator: the same operator has the same
colour in both policies' pictures); every wait is a red tick where it releases, and a dashed
line from where the vEU began to wait when it had to. An ordinary-kernel segment is one box over
all rows. The title gives the model, the policy, the makespan and the serial makespan.

Rows: a segment has up to hundreds of vEUs; rows are drawn at `ROW` pixels with at most
`MAX_ROWS` rows (vEUs beyond are folded onto the last rows' colours: stated in the legend).
Output is deterministic: coordinates printed with two decimals, elements in a fixed order.
"""

from __future__ import annotations

from html import escape

from tilekit.ir.program import Program
from tilekit.ram.timeline import simulate

WIDTH = 1200
LEFT = 70
TOP = 60
ROW = 3.0
MAX_ROWS = 240
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#e15759", "#bab0ac", "#ff9da7", "#86bcb6", "#8cd17d", "#d4a6c8", "#499894")


def _f(x: float) -> str:
    return f"{x:.2f}"


def render(program: Program, model: str) -> str:
    """The SVG text of `program` (see the module docstring)."""
    timeline = simulate(program)
    launch = program.launch_us
    total = sum(timeline.segment_us) + launch * len(program.segments)
    rows = min(MAX_ROWS, max([s.veus for s in program.segments] + [1]))
    height = TOP + rows * ROW + 50
    scale = (WIDTH - LEFT - 20) / total if total > 0 else 1.0
    est = program.estimate
    title = (f"{model}: {program.policy} policy on {program.hardware}: makespan "
             f"{est.get('makespan_us', round(total, 1))} us, serial makespan "
             f"{est.get('serial_us', '?')} us, one kernel per op "
             f"{est.get('per_op_kernels_us', '?')} us")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{_f(height)}" '
           f'viewBox="0 0 {WIDTH} {_f(height)}" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{LEFT}" y="18" font-size="13">{escape(title)}</text>',
           f'<text x="{LEFT}" y="34">{len(program.segments)} segments '
           f"({est.get('persistent_segments', '?')} persistent), {program.tasks} rTasks, "
           f"launch overhead {launch} us ({escape(program.launch_source[:90])})</text>",
           f'<text x="{LEFT}" y="48">rows: vEUs (first {rows}); boxes: rTasks coloured by '
           "operator; red ticks: barriers (a wait released), dashed: a vEU idle at a wait; grey: launch gaps and ordinary kernels</text>"]
    x = float(LEFT)
    for seg, line in zip(program.segments, timeline.segments):
        out.append(f'<rect class="launch" x="{_f(x)}" y="{TOP}" width="{_f(launch * scale)}" '
                   f'height="{_f(rows * ROW)}" fill="#eeeeee"/>')
        x += launch * scale
        if seg.kind == "kernel":
            op = seg.operators[0]
            out.append(f'<rect class="kernel" data-op="{op}" x="{_f(x)}" y="{TOP}" '
                       f'width="{_f(max(line.length_us * scale, 0.5))}" '
                       f'height="{_f(rows * ROW)}" fill="{PALETTE[op % len(PALETTE)]}" '
                       f'stroke="#555555" stroke-width="0.5"><title>'
                       f"{escape(program.operators[op].kernel)} (ordinary kernel)</title></rect>")
        else:
            for box in line.boxes:
                row = min(box.veu, rows - 1)
                out.append(f'<rect class="rtask" data-op="{box.op}" '
                           f'x="{_f(x + box.start * scale)}" y="{_f(TOP + row * ROW)}" '
                           f'width="{_f(max((box.end - box.start) * scale, 0.3))}" '
                           f'height="{_f(ROW * 0.9)}" '
                           f'fill="{PALETTE[box.op % len(PALETTE)]}"/>')
            for bar in line.barriers:  # a tick where the wait releases, a line while idle
                row = min(bar.veu, rows - 1)
                y0, y1 = TOP + row * ROW, TOP + row * ROW + ROW * 0.9
                end = _f(x + bar.end * scale)
                out.append(f'<line class="barrier" data-op="{bar.op}" x1="{end}" '
                           f'y1="{_f(y0)}" x2="{end}" y2="{_f(y1)}" stroke="#d62728" '
                           'stroke-width="0.8"/>')
                if bar.end > bar.start:
                    y = _f(TOP + row * ROW + ROW * 0.45)
                    out.append(f'<line class="wait" x1="{_f(x + bar.start * scale)}" y1="{y}" '
                               f'x2="{end}" y2="{y}" stroke="#d62728" stroke-width="0.5" '
                               'stroke-dasharray="2,1"/>')
        x += line.length_us * scale
    axis_y = TOP + rows * ROW + 14
    out.append(f'<line x1="{LEFT}" y1="{_f(axis_y)}" x2="{_f(x)}" y2="{_f(axis_y)}" '
               'stroke="black"/>')
    out.append(f'<text x="{LEFT}" y="{_f(axis_y + 14)}">0 us</text>')
    out.append(f'<text x="{_f(x)}" y="{_f(axis_y + 14)}" text-anchor="end">'
               f"{_f(total)} us (estimated)</text>")
    out.append('<text x="4" y="{}" transform="rotate(-90 12 {})">vEU</text>'.format(
        _f(TOP + rows * ROW / 2), _f(TOP + rows * ROW / 2)))
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["render"]
