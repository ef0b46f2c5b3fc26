"""Roller: tiles constructed, not searched (Roller, OSDI'22; docs/roll.md).

- `tilekit.roll.problem`: an expr op reduced to its iteration space and footprints (`Problem`);
- `tilekit.roll.rtile`: rTiles, alignment and the padding-waste rule;
- `tilekit.roll.cost`: the micro performance model, shared by every stage that estimates;
- `tilekit.roll.construct`: scale-up and scale-out, ranking by the model;
- `tilekit.roll.schedule`: the pass `roll_module(module, profile, top_k) -> Module`;
- `tilekit.roll.dynamic`: a symbolic module rolled once for a CPU (DietCode's micro-kernels);
- `tilekit.roll.workloads`: the operator suite of specs/workloads.yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = ["Candidate", "Estimate", "Problem", "RTile", "cost_tiles", "machine",
           "module_estimate", "problem_from_analysis", "roll_module", "roll_problem"]

if TYPE_CHECKING:
    from tilekit.roll.construct import Candidate, roll_problem
    from tilekit.roll.cost import Estimate, cost_tiles, machine
    from tilekit.roll.problem import Problem, problem_from_analysis
    from tilekit.roll.rtile import RTile
    from tilekit.roll.schedule import module_estimate, roll_module


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "Candidate": "construct",
    "roll_problem": "construct",
    "Estimate": "cost",
    "cost_tiles": "cost",
    "machine": "cost",
    "Problem": "problem",
    "problem_from_analysis": "problem",
    "RTile": "rtile",
    "module_estimate": "schedule",
    "roll_module": "schedule",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
