"""Hardware profiles: validated data describing a target device (hwprofiles/*.yaml).

    from tilekit.hw import load_profile
    hw = load_profile("h100")            # or an alias ("H100"), or a path to a YAML file
    hw.sm_count, hw.smem_per_block, hw.dram_bandwidth, hw.peak_flops("float16", tensor_core=True)

Modules: `profile` (the frozen `Profile` record and its consistency rules), `cpu` (a `kind:
cpu` profile's figures, `CpuSpec` and `CpuLevel`, their rules, the derived peaks and the GPU
fields they fill), `schema` (the file format: fields, units, sources, located errors),
`registry` (names, folders, loading), `units` (unit spellings and printing), `describe` (rows
for people), `edit` (changing a profile's text in place), `probe_profile` (`tk-hw probe`'s
measurements -> a profile, pure; the measuring needs a device and lives in
`tilekit.runtime.probe`), `probe_cpu_profile` (the same for a CPU's measurements, from
`tilekit.runtime.probe_cpu`). The format is documented in docs/hwprofiles.md.

    cpu = load_profile("milan")          # kind: cpu
    cpu.cores, cpu.simd_bytes, cpu.cache("l2").bandwidth, cpu.fork_join_s, cpu.march
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = [
    "Achievable", "CpuLevel", "CpuSpec", "DTYPES", "ENV_VAR", "FEATURES", "Features", "KINDS", "MemoryLevel",
    "MmaShape", "Profile", "SCHEMA_VERSION", "builtin_dir", "host_cpu_profile", "list_profiles", "load_profile",
    "load_recorded_profile", "profile_dirs", "profile_names", "read_profile_file",
    "recorded_profile", "resolve",
]

if TYPE_CHECKING:
    from tilekit.hw.cpu import CpuLevel, CpuSpec
    from tilekit.hw.profile import (DTYPES, FEATURES, KINDS, Achievable, Features, MemoryLevel,
                                    MmaShape, Profile)
    from tilekit.hw.registry import (ENV_VAR, builtin_dir, list_profiles, load_profile,
                                     load_recorded_profile, profile_dirs, profile_names,
                                     read_profile_file, recorded_profile, resolve)
    from tilekit.hw.schema import SCHEMA_VERSION


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "CpuLevel": "cpu",
    "CpuSpec": "cpu",
    "DTYPES": "profile",
    "FEATURES": "profile",
    "KINDS": "profile",
    "Achievable": "profile",
    "Features": "profile",
    "MemoryLevel": "profile",
    "MmaShape": "profile",
    "Profile": "profile",
    "ENV_VAR": "registry",
    "builtin_dir": "registry",
    "host_cpu_profile": "registry",
    "list_profiles": "registry",
    "load_profile": "registry",
    "load_recorded_profile": "registry",
    "profile_dirs": "registry",
    "profile_names": "registry",
    "read_profile_file": "registry",
    "recorded_profile": "registry",
    "resolve": "registry",
    "SCHEMA_VERSION": "schema",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
