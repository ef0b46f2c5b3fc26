"""The picture of a program: vEUs (rows) over estimated time (columns), one SVG file.

Every segment is drawn after the previous one on one time axis (kernel launches between them
as grey gaps of the launch overhead). In a persistent segment each rTask is a box on its vEU
row, coloured by operator (a fixed palette indexed by operator: the same operator has the same
colour in both policies' pictures); every wait is a red tick where it releases, and a dashed
line from where the vEU began to wait when it had to. An ordinary-kernel segment is one box over
all rows. The title gives the model, the policy, the makespan and the serial makespan.

Rows: a segment has up to hundreds of vEUs; rows are drawn at `ROW` pixels, the first
`MAX_ROWS` vEUs of each segment (the packing fills the lowest vEUs first, so the rows left out
are the least busy; the legend says how many are shown).
Output is deterministic: coordinates printed with one decimal, elements in a fixed order; each
operator's rTasks are one path (a subpath per rTask) and a segment's barriers another, which
keeps a picture of thousands of rTasks small.
"""

from __future__ import annotations

from html import escape

from tilekit.ir.program import Program
from tilekit.ram.timeline import simulate

WIDTH = 1200
LEFT = 70
TOP = 60
ROW = 3.0
MAX_ROWS = 160
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#e15759", "#bab0ac", "#ff9da7", "#86bcb6", "#8cd17d", "#d4a6c8", "#499894")


def _f(x: float) -> str:
    return f"{x:.1f}"


def render(program: Program, model: str) -> str:
    """The SVG text of `program` (see the module docstring)."""
    timeline = simulate(program)
    launch = program.launch_us
    total = sum(timeline.segment_us) + launch * len(program.segments)
    most = max([s.veus for s in program.segments] + [1])
    rows = min(MAX_ROWS, most)
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
           f'<text x="{LEFT}" y="48">rows: vEUs (the first {rows} of up to {most}); boxes: '
           "rTasks coloured by operator; red ticks: barriers (a wait released), dashed: a vEU "
           "idle at a wait; grey: launch gaps and ordinary kernels</text>"]
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
            by_op: dict[int, list[str]] = {}
            for box in line.boxes:  # one path per operator, one subpath per rTask
                if box.veu < rows:
                    by_op.setdefault(box.op, []).append(
                        f"M{_f(x + box.start * scale)} {_f(TOP + box.veu * ROW)}"
                        f"h{_f(max((box.end - box.start) * scale, 0.3))}v{_f(ROW * 0.9)}H"
                        f"{_f(x + box.start * scale)}z")
            for op in sorted(by_op):
                out.append(f'<path class="rtasks" data-op="{op}" '
                           f'fill="{PALETTE[op % len(PALETTE)]}" d="{"".join(by_op[op])}">'
                           f"<title>{escape(program.operators[op].kernel)}</title></path>")
            ticks, idle = [], []
            for bar in line.barriers:  # a tick where the wait releases, a dash while idle
                if bar.veu < rows:
                    end = _f(x + bar.end * scale)
                    ticks.append(f"M{end} {_f(TOP + bar.veu * ROW)}v{_f(ROW * 0.9)}")
                    if bar.end > bar.start:
                        idle.append(f"M{_f(x + bar.start * scale)} "
                                    f"{_f(TOP + bar.veu * ROW + ROW * 0.45)}H{end}")
            if ticks:
                out.append(f'<path class="barriers" stroke="#d62728" stroke-width="0.8" '
                           f'fill="none" d="{"".join(ticks)}"/>')
            if idle:
                out.append(f'<path class="waits" stroke="#d62728" stroke-width="0.5" '
                           f'stroke-dasharray="2,1" fill="none" d="{"".join(idle)}"/>')
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
