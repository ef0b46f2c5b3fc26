"""tk-hw probe on a GPU: the measurements are plausible and the written profile validates.

Marked `gpu`: skipped (by tests/conftest.py) where CuPy or a CUDA device is missing. The ranges
are wide on purpose (the device may be any NVIDIA GPU from sm_80 on, its base profile another
model of the same arch): they catch a benchmark that measures the wrong thing (a loop the
compiler removed, a buffer served by the wrong level), not a slow device.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilekit.hw import load_profile, read_profile_file
from tilekit.hw.probe_profile import RESULTS, default_base, measurement_rows, probed_profile

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def measured():
    from tilekit.runtime import probe

    device = probe.open_device()
    began = time.monotonic()
    measurements = probe.measure(device, quick=True)
    seconds = time.monotonic() - began
    for row in measurement_rows(measurements):  # shown with `pytest -s`
        print("  ".join(row))
    return measurements, seconds


def test_quick_probe_is_quick(measured):
    assert measured[1] < 60


def test_every_measurement_is_there(measured):
    measurements, _ = measured
    expected = set(RESULTS)
    if measurements["attributes"]["ComputeCapabilityMajor"] < 8:
        expected -= {"mma_fp16", "mma_bf16", "mma_tf32"}
    assert set(measurements["results"]) == expected


def test_measurements_are_plausible(measured):
    measurements, _ = measured
    r = {name: entry["value"] for name, entry in measurements["results"].items()}
    base = load_profile(default_base(measurements["arch"]))
    dram = base.dram_bandwidth
    assert 0.1 * dram < r["dram_copy"] < 1.5 * dram
    assert 0.1 * dram < r["dram_read"] < 1.5 * dram
    # L2 serves repeated reads faster than DRAM, and not at an absurd rate.
    assert r["dram_copy"] < r["l2_read"] < 20 * dram
    assert 0.2 * base.smem_bandwidth_per_sm < r["smem_read"] < 1.2 * base.smem_bandwidth_per_sm
    fp32 = base.peak_flops("fp32")
    assert 0.2 * fp32 < r["fp32_fma"] < 1.2 * fp32
    for dtype in ("fp16", "bf16", "tf32"):
        if f"mma_{dtype}" in r and base.has_peak(dtype, tensor_core=True):
            peak = base.peak_flops(dtype, tensor_core=True)
            assert 0.1 * peak < r[f"mma_{dtype}"] < 1.2 * peak, dtype
    assert 3e-7 < r["launch_events"] < 2e-4
    assert 3e-7 < r["launch_wall"] < 2e-4


def test_measurements_make_a_valid_profile(measured):
    measurements, _ = measured
    path = default_base(measurements["arch"])
    text = probed_profile(measurements, path.read_text(), str(path))
    assert f"measured: tk-hw probe (device attribute MultiProcessorCount) on " \
           f"{measurements['device']}" in text


def test_the_command_writes_a_profile_that_validates(tmp_path):
    out = tmp_path / "probed.yaml"
    tk_hw = [sys.executable, str(ROOT / "bin" / "tk-hw")]
    proc = subprocess.run([*tk_hw, "probe", "--quick", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "DRAM copy" in proc.stderr and "Traceback" not in proc.stderr
    check = subprocess.run([*tk_hw, "validate", str(out)], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0 and check.stdout == f"ok: {out}\n", check.stderr
    p = read_profile_file(out)
    assert p.name.endswith("-probed")
    assert p.sources["memory[l2].bandwidth"].startswith("measured: tk-hw probe (")
    assert p.sources["achievable.dram"].startswith("derived: ")
