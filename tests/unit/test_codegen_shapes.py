"""FileCheck-style checks of the emitted CUDA, shape choice, the IR section, determinism."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilekit.codegen import generate
from tilekit.codegen.helpers import helpers_sha256
from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.codec import dumps, loads
from tilekit.ir.model import Kernel, Module, Op, Tensor
from tilekit.ir.verify import verify

from codegen_support import FIXTURES, fixture, filecheck, without_groups, without_tiles


def kernels_of(name: str, transform=lambda m: m):
    return generate(transform(fixture(name))).kernels


def test_staged_contraction_has_shared_tiles_and_a_step_loop():
    (k,) = kernels_of("matmul_bias_relu")
    assert k.shape == "staged" and k.ops == ("mm", "bias_relu")
    filecheck(k.source,
              # the body's buffers, carved from its shared-memory base (x box [32, 8] and
              # w box [8, 32]: 1 KB each), then the kernel entry that runs the body
              r"CHECK: float\* s_x_0 = reinterpret_cast<float\*>\(tk_smem \+ 0\);",
              r"CHECK: float\* s_w_1 = reinterpret_cast<float\*>\(tk_smem \+ 1024\);",
              r"CHECK: for \(int q_k = 0; q_k < 37; q_k \+= 8\)",
              r"CHECK: __syncthreads\(\);",
              # the box copy: every thread, padding outside the tensor
              r"CHECK: s_x_0\[8 \* l_0 \+ l_1\] = \(tk_in\(lo_0 \+ l_0, 50\) && "
              r"tk_in\(lo_1 \+ l_1, 37\) \? t_x\[",
              r"CHECK: __syncthreads\(\);",
              # 37 % 8 != 0: the last step is shorter
              r"CHECK: for \(int a_k = 0; a_k < \(37 - q_k < 8 \? 37 - q_k : 8\); \+\+a_k\)",
              r"CHECK: acc\[.*\] \+= f_x_0\[.*\] \* f_w_1\[.*\];",
              # epilogue: 50 and 70 are not multiples of 32: guarded stores, bias and ReLU
              r"CHECK: if \(a_i < 50 && a_j < 70\)",
              r"CHECK: tk_max_c\(v_t_0 \+ t_b\[a_j\], 0.0f\)",
              r"CHECK: t_y\[70 \* a_i \+ a_j\] = ",
              r"CHECK-NOT: t_t\[",            # the matmul result never reaches memory
              r'CHECK: extern "C" __global__ void __launch_bounds__\(128, 1\)',
              r"CHECK: TK_STATIC_SMEM\(tk_smem, 2048\);",
              r"CHECK: tk_k0_body\(t_x, t_w, t_b, t_y, \(int\)blockIdx.x, \(int\)gridDim.x, "
              r"tk_smem\);",
              r"CHECK-NOT: float4")           # rows of 37 floats are not 16-byte aligned
    assert k.args == ("x", "w", "b", "y") and k.writes == ("y",)


def test_aligned_contraction_uses_float4_loads():
    (k,) = kernels_of("matmul_aligned")
    assert k.schedule["vectorized"] == ["a", "b"]
    filecheck(k.source,
              r"CHECK-COUNT-2: \*reinterpret_cast<float4\*>\(&s_",
              r"CHECK-NOT: tk_in\(",          # tiles divide every size: no checks at all
              r"CHECK-NOT: if \(a_i <")


def test_convolution_stages_a_halo_box_with_zero_padding():
    (k,) = kernels_of("conv_bias_relu")
    assert k.shape == "staged"
    boxes = {b["tensor"]: b["box"] for b in k.schedule["smem_buffers"]}
    # h: 4 outputs at stride 2 with a 3-tap window -> (4-1)*2 + 3 = 9 rows; 2 channels/step
    assert boxes == {"x": [1, 2, 9, 9], "w": [8, 2, 3, 3]}
    filecheck(k.source,
              r"CHECK-NOT: q_kh",                # one step covers the window: no loop
              r"CHECK: const int lo_\d+ = 2 \* o_h - 1;",
              r"CHECK: const int lo_\d+ = 2 \* o_q - 1;",
              # 2 channels per step over 3: the channel is checked too
              r"CHECK: tk_in\(lo_1 \+ l_1, 3\) && tk_in\(lo_2 \+ l_2, 13\) && "
              r"tk_in\(lo_3 \+ l_3, 13\) \? t_x\[",
              r"CHECK: : 0.0f\);")


def test_fused_softmax_keeps_intermediates_on_chip():
    (k,) = kernels_of("softmax")
    assert k.shape == "fused" and k.ops == ("max", "exp", "sum", "div")
    assert k.schedule["inlined"] == ["exp"] and k.schedule["shared"] == ["m", "s"]
    assert k.args == ("x", "y") and k.writes == ("y",)
    filecheck(k.source,
              r"CHECK: float\* s_m = reinterpret_cast<float\*>\(tk_smem \+ 0\);",
              r"CHECK: float\* s_s = reinterpret_cast<float\*>\(tk_smem \+ 16\);",
              r"CHECK: float\* red0 = reinterpret_cast<float\*>\(tk_smem \+ 32\);",
              # 2 rows per block, 256 threads: 64 lanes per row, so two warps per row
              # combine through shared memory
              r"CHECK: // stage 0: max; region \[2\], 64 lanes per point",
              r"CHECK: tk_warp_max<32>",
              r"CHECK: red0\[tid / 32\] = acc_0;",
              r"CHECK: __syncthreads\(\);",
              r"CHECK: acc_1 = tk_max\(acc_1, red0\[tid / 32 \+ w\]\);",
              r"CHECK: s_m\[l_1\] = ",
              r"CHECK: __syncthreads\(\);",
              r"CHECK: // stage 1: sum",
              r"CHECK: expf\(",                # exp inlined into the sum
              r"CHECK: tk_warp_sum<32>",
              r"CHECK: __syncthreads\(\);",
              r"CHECK: // stage 2: div",
              r"CHECK: t_y\[",
              r"CHECK-NOT: t_[mes]\[")        # no global stores (or loads) of m, e, s
    # 2 per cross-warp fold (the second also separates the stages)
    assert k.source.count("__syncthreads") == 4


def test_fused_convolutions_compute_the_halo():
    (k,) = kernels_of("conv_chain")
    assert k.shape == "fused"
    # Output tile 4x4x4; conv2 reads r (= relu(conv1)) at h-1..h+4: a 6x6 region, all 4
    # channels; the region origin moves with the tile and the borders read zero padding.
    assert k.schedule["regions"] == {"conv1": [4, 6, 6], "conv2": [4, 4, 4]}
    filecheck(k.source,
              r"CHECK: float\* s_r = reinterpret_cast<float\*>\(tk_smem \+ 0\);  // r region "
              r"\[4, 6, 6\]",
              r"CHECK: const int r0_1 = o_1 - 1;",
              r"CHECK: s_r\[36 \* l_2 \+ 6 \* l_1 \+ l_0\] = ",
              r"CHECK: __syncthreads\(\);",
              r"CHECK: \? s_r\[",
              r"CHECK-NOT: t_t\[|t_r\[")


def test_default_schedule_without_tiles():
    kernels = kernels_of("matmul_bias_relu", without_tiles)
    (k,) = kernels
    assert k.shape == "default"
    assert k.schedule == {"source": "default", "threads": 256, "lanes": 32,
                          "points_per_block": 8}
    filecheck(k.source, r"CHECK: grid-stride",
              r"CHECK: for \(int a_k = lane; a_k < 37; a_k \+= 32\)",
              r"CHECK: tk_warp_sum<32>",
              r"CHECK: if \(active && lane == 0\)")


def test_tiled_shape_for_a_reduction_without_reuse():
    kernels = kernels_of("pool_transpose")
    assert [k.shape for k in kernels] == ["tiled", "tiled"]
    filecheck(kernels[0].source, r"CHECK: -TK_INF", r"CHECK: tk_max\(acc\[")


def test_one_kernel_per_op_when_the_module_lists_none():
    result = generate(without_groups(fixture("softmax")))
    assert [k.name for k in result.module.kernels] == ["k_max", "k_exp", "k_sum", "k_div"]
    assert all(k.launch["entries"] == [f"tk_{k.name}"] for k in result.module.kernels)


def test_gather_uses_its_cuda_implementation():
    kernels = kernels_of("gather")
    assert [k.shape for k in kernels] == ["opaque:Gather", "default"]
    filecheck(kernels[0].source, r"CHECK: const long long k_0 = \(.* < 0LL \? .* \+ 11LL : ",
              r"CHECK: tk_in\(k_0, 11LL\) \?")


def test_unknown_opaque_type_is_an_error_naming_the_op():
    module = Module(
        model="m", inputs=("x",), outputs=("y",),
        tensors={"x": Tensor((4, 3), "float32", "input"), "y": Tensor((3, 4), "float32",
                                                                         "output")},
        ops=(Op(name="resize", kind="opaque",
                opaque={"type": "Resize", "inputs": ["x"], "outputs": ["y"], "attrs": {}}),))
    with pytest.raises(UnsupportedError) as info:
        generate(module)
    text = info.value.message()
    assert "ops[0] (resize)" in text and "'Resize' has no kernel implementation" in text
    assert "Gather" in text


def test_an_opaque_op_inside_a_group_splits_it():
    module = fixture("gather")
    grouped = replace(module, kernels=(Kernel("all", ("lookup", "scale")),))
    result = generate(grouped)
    (kernel,) = result.module.kernels
    assert kernel.launch["entries"] == ["tk_all__lookup", "tk_all__scale"]
    assert "opaque op 'lookup' cannot share a kernel" in kernel.launch["split"]
    assert result.notes and "split into one kernel per op" in result.notes[0]


def test_bad_tile_is_bad_input():
    module = fixture("matmul_aligned")
    op = replace(module.ops[0], tile={"block": {"i": 32, "j": 64}, "thread": {"i": 3, "j": 4},
                                      "step": {"k": 16}})
    with pytest.raises(TilekitError, match=r"ops\[0\] \(mm\)\.tile\.thread\.i"):
        generate(replace(module, ops=(op,)))
    op = replace(module.ops[0], tile={"block": {"i": 64, "j": 64}, "thread": {"i": 1, "j": 1},
                                      "step": {"k": 16}})
    with pytest.raises(TilekitError, match="4096 threads per block"):
        generate(replace(module, ops=(op,)))


def test_steps_shrink_to_fit_shared_memory():
    module = fixture("matmul_aligned")
    op = replace(module.ops[0], tile={"block": {"i": 32, "j": 64}, "thread": {"i": 4, "j": 4},
                                      "step": {"k": 48}})
    big = replace(module, ops=(op,), tensors={**module.tensors})
    result = generate(big)  # 48 KB limit without a profile: 32*48 + 48*64 floats = 18 KB fits
    assert result.kernels[0].schedule["step"] == {"k": 48}
    from tilekit.codegen.plan import plan_group, readers
    from tilekit.codegen.staged import op_facts
    from tilekit.ir.payloads import read_tile
    from tilekit.schedule.shape import fit_steps
    plan = plan_group(big, Kernel("k", ("mm",)), "k", readers(big))
    tile = read_tile(op.tile, plan.stages[0].main.spatial, plan.stages[0].main.reduction, "t")
    assert fit_steps(op_facts(plan.stages[0].main), tile, 8 * 1024).step == (12,)


@pytest.mark.parametrize("name", FIXTURES)
def test_output_is_deterministic_and_valid(name):
    module = fixture(name)
    first = dumps(generate(module).module)
    second = dumps(generate(fixture(name)).module)
    assert first == second
    again = loads(first)
    verify(again)
    assert dumps(again) == first
    assert again.codegen["helpers"] == {"file": "runtime.cuh", "sha256": helpers_sha256()}
    for record in again.codegen["kernels"]:
        assert set(record) >= {"name", "group", "entry", "ops", "shape", "schedule", "grid",
                               "block", "smem_bytes", "args", "writes", "source"}
        assert record["source"].count('#include "runtime.cuh"') == 1
        assert "/" + "work" not in record["source"]  # no absolute paths


def test_rolled_reduction_without_reuse_gets_lanes():
    kernels = kernels_of("rownorm")
    assert [k.shape for k in kernels] == ["default", "tiled"]
    assert kernels[0].schedule["lanes"] == 32 and "tile_ignored" in kernels[0].schedule
    filecheck(kernels[0].source, r"CHECK: for \(int a_j = lane; a_j < 300; a_j \+= 32\)")


@pytest.mark.parametrize("j", [3, 48, 96, 200])
def test_fused_blocks_are_whole_warps_and_lane_groups_divide_them(j):
    """A kernel tile of j threads: the block is rounded up to whole warps (the shuffles use
    the full mask), and every stage's lane group divides the block."""
    module = fixture("softmax")
    kernel = replace(module.kernels[0], tile={"block": {"i": 1, "j": j},
                                              "thread": {"i": 1, "j": 1}})
    (k,) = generate(replace(module, kernels=(kernel,))).kernels
    threads = k.schedule["threads"]
    assert k.shape == "fused" and threads % 32 == 0 and threads >= j
    assert k.block == (threads, 1, 1)
    assert all(threads % lanes == 0 for lanes in k.schedule["lanes"].values())


def test_fused_cross_warp_partials_count_as_shared_memory():
    (k,) = kernels_of("softmax")
    # 256 threads: 8 warps, two stages fold across warps, each through 8 slots
    assert [(b.name, b.nbytes) for b in k.program.shared if b.name.startswith("red")] == [
        ("red0", 64), ("red1", 64)]
    buffers = 2 * 16               # s_m[2] and s_s[2], each rounded up to 16 bytes
    partials = 2 * 8 * 8           # per stage, a slot per warp at 8 bytes
    assert k.smem_planned == buffers + partials
    assert f"shared memory: {buffers + partials} bytes" in k.source


@pytest.mark.parametrize("points, wide", [(2 ** 31 - 1000, True), (2 ** 30, False)])
def test_grid_stride_counter_is_64_bit_within_a_stride_of_int_max(points, wide):
    """p < points, then p += gridDim.x * 256: an int counter overflows for a tensor within
    one grid stride of 2^31 even though the tensor itself has fewer elements."""
    module = Module(
        model="m", inputs=("x",), outputs=("y",),
        tensors={"x": Tensor((points,), "float32", "input"),
                 "y": Tensor((points,), "float32", "output")},
        ops=(Op(name="neg", expr="y[i] = -x[i]"),))
    (k,) = generate(module).kernels
    assert k.shape == "default"
    assert ("long long p" in k.source) is wide
    gathered = Module(
        model="g", inputs=("x", "ids"), outputs=("y",),
        tensors={"x": Tensor((points,), "float32", "input"),
                 "ids": Tensor((points,), "int64", "input"),
                 "y": Tensor((points,), "float32", "output")},
        ops=(Op(name="take", kind="opaque", opaque={
            "type": "GatherElements", "inputs": ["x", "ids"], "outputs": ["y"],
            "attrs": {"axis": 0}}),))
    (k,) = generate(gathered).kernels
    assert k.shape == "opaque:GatherElements"
    assert ("long long p" in k.source) is wide
