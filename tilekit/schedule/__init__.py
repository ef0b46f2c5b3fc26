"""Scheduling decisions shared by the stages that make them and the stages that carry them
out: the explicit default schedule, CUDA's fixed limits, and (in `tilekit.schedule.shape`) the
one decision of a kernel's shape that the cost model and the code generator both read.

It sits above the IR and the hardware profiles and below every pass (roll, weld, codegen) and
executor (the tiled CPU mode), so that none of them has to import another to agree.
"""
