// tilekit CPU helpers, included by every kernel of the C++ target (tilekit/tile/cpp.py).
//
// The same helpers as the device's runtime.cuh (floor division, NaN-propagating max/min,
// sigmoid, bounds checks), compiled as host C++: host_types.h gives the half types and what
// CUDA's headers would, and TK_HOST_EMUL leaves out runtime.cuh's device-only parts (warp
// shuffles, tensor cores, progress counters), which CPU programs never use (the CPU lowering
// refuses them). Its SHA-256 is recorded in the IR (codegen.helpers.sha256).
#pragma once

#include <climits>
#include <cstdint>

#define TK_HOST_EMUL 1
#include "host_types.h"
#include "runtime.cuh"
