"""Each kernel's time on the device against the roll's estimate, from a models step's record.

    python3 tests/gpu/kernel_fit.py KERNELS.json --work build/gpu [--json out.json]

`KERNELS.json` is the models step's `kernels.json` (tests/gpu/gpu_check.py: every kernel call
of each timed variant, CUDA events, the mean of 5 runs); `--work` the folder the variants were
built in (`<work>/models/<model>[.f16].<variant>.cuda.yaml`): the pipeline is deterministic,
so the IR built on a CPU machine before a lease (docs/gpu.md, "A short lease") is the IR
that ran. For each kernel: its shape, its split of the reduction, threads and blocks as
launched, the model's estimate (a welded group's `estimate`, tk-weld's; else its op's
`tile.estimate`, tk-roll's) and the time measured;
then measured over estimated by shape and by warps per SM (the blocks an SM holds at once, as
the model counts them, times their warps). Runs anywhere: no GPU, no CuPy.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tilekit.hw import load_profile  # noqa: E402
from tilekit.ir.codec import read_module  # noqa: E402
from tilekit.schedule.residency import blocks_per_sm  # noqa: E402


def kernel_rows(module, calls: list, hw) -> list[dict]:
    """One row per kernel called in the run: what the roll priced, what the device took
    (a kernel called several times, e.g. in a loop, keeps the sum of its calls)."""
    ops = {op.name: op for op in module.ops}
    grouped = {k.name: k.estimate for k in module.kernels if k.estimate}
    measured: dict[str, float] = defaultdict(float)
    for name, ms in calls:
        measured[name] += ms
    rows = []
    for k in module.codegen.get("kernels", []):
        if k["entry"] not in measured:
            continue
        tiles = [ops[n].tile or {} for n in k["ops"] if n in ops]
        # a welded group's own estimate (one launch, its intermediates on chip), else its op's
        own = grouped.get(k["name"])
        estimate = own["time_us"] if own else sum(
            (t.get("estimate") or {}).get("time_us", 0.0) for t in tiles)
        threads = math.prod(k["block"])
        blocks = math.prod(k["grid"])
        first = tiles[0] if tiles else {}
        # ptxas's registers where the module was compiled (`resources`), else the roll's
        used = k.get("resources") or {}
        regs = used.get("registers") or first.get("regs") or 32
        smem = (k.get("smem_bytes") or 0) + (used.get("smem_static") or 0)
        resident = min(int(blocks_per_sm(hw, threads, regs, smem)[0]),
                       -(-blocks // hw.sm_count))
        rows.append({"kernel": k["entry"], "shape": k["shape"], "ops": len(k["ops"]),
                     "split_k": first.get("split_k"), "threads": threads, "blocks": blocks,
                     "warps_per_sm": resident * -(-threads // hw.warp_size),
                     "estimated_us": round(estimate, 3),
                     "measured_us": round(measured[k["entry"]] * 1e3, 3)})
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Measured over estimated, by shape (and split), then by warps per SM."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["estimated_us"] > 0:
            shape = r["shape"] + (" split" if r["split_k"] else "")
            band = next(b for b in (2, 4, 8, 12, 16, 32, 64, 10 ** 9) if r["warps_per_sm"] <= b)
            groups[(shape, band)].append(r["measured_us"] / r["estimated_us"])
    lines = [f"{'shape':<14} {'warps/SM':>9} {'kernels':>8} {'meas/est median':>16} "
             f"{'min':>6} {'max':>6}"]
    for (shape, band), ratios in sorted(groups.items()):
        lines.append(f"{shape:<14} {'<= ' + str(band) if band < 10 ** 9 else '> 64':>9} "
                     f"{len(ratios):>8} {statistics.median(ratios):>16.2f} "
                     f"{min(ratios):>6.2f} {max(ratios):>6.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", type=Path, help="the models step's kernels.json")
    parser.add_argument("--work", type=Path, required=True,
                        help="the folder the variants were built in (its models/ subfolder)")
    parser.add_argument("--hw", default="h100", help="the profile the variants were rolled for")
    parser.add_argument("--json", type=Path, help="write every kernel's row here")
    args = parser.parse_args(argv)
    hw = load_profile(args.hw)
    runs = json.loads(args.kernels.read_text())
    rows = []
    for variant, calls in sorted(runs.items()):
        ir = args.work / "models" / f"{variant}.cuda.yaml"
        if not ir.exists():
            print(f"kernel_fit: {ir} is not built (build it as the models step did)",
                  file=sys.stderr)
            return 2
        rows += [dict(r, variant=variant) for r in kernel_rows(read_module(str(ir)), calls, hw)]
    print("\n".join(summary(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=0) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
