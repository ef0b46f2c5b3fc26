"""Per-inference figures of a ground module from its IR: kernel launches, host
synchronisations and the estimated time of every kernel group and control op as placed
(shared by the grind benchmarks; ground once with `--place host` for the host-driven
baseline, once as tk-grind decides)."""

from __future__ import annotations

from tilekit import pipeline
from tilekit.ir.graph import control_records


def ground(module, place: str = "auto", hw: str = "h100"):
    """`module` (imported) rolled and ground for `hw`."""
    return pipeline.run(module.with_stage("import"), ["roll", "grind"],
                        pipeline.Context.for_hw(hw, place=place))


def inference_figures(module) -> dict:
    """Launches, host syncs and estimated microseconds per inference, as placed."""
    records = control_records(module)
    out = {"launches": 0, "syncs": 0, "est_us": 0.0}
    for kernel in module.kernels:
        rec = records.get(kernel.ops[0])
        if rec is None:
            out["launches"] += 1
            out["est_us"] += float((kernel.estimate or {}).get("time_us", 0.0))
            continue
        est = rec.grind["estimate"]
        device = rec.grind["run"] == "device"
        out["launches"] += est["device_launches"] if device else est["host_launches"]
        out["syncs"] += est["device_syncs"] if device else est["host_syncs"]
        out["est_us"] += est["device_us"] if device else est["host_us"]
    out["est_us"] = round(out["est_us"], 1)
    return out
