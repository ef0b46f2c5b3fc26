"""An interpreter of tile programs on NumPy that also counts what the hardware would do.

In the spirit of Triton's `TRITON_INTERPRET=1`: a kernel runs block by block, its block-level
statements once per block, each thread region for all the block's threads at once (arrays
over the threads, with a mask for the threads a branch or a loop leaves behind), so warp
collectives (shuffles, `ldmatrix`, `mma.sync`) are exact and barriers are implicit (a region
ends for every thread before the next statement). What it counts, per kernel and per access
site, for the blocks it ran:

- **global memory**: per warp request, the 32-byte sectors its active lanes touch against
  the fewest that could carry the bytes (1.0: fully coalesced; 32 lanes reading floats 128
  bytes apart: 32 sectors for 4 bytes of use each);
- **shared memory**: per warp request, the wavefronts (conflict degree) the bank mapping
  needs: for each bank, the number of distinct 4-byte words the active lanes address
  (one address broadcasts), the maximum over the 32 banks; 16-byte accesses are served a
  quarter warp at a time, `ldmatrix` one 8x8 matrix (eight 16-byte rows) at a time; the
  fewest a request needs are its unique bytes over 128, and at least one per quarter warp
  for 16-byte accesses (a wavefront returns one register per lane: a broadcast 16-byte
  load still takes four);
- **work**: floating-point operations on the FMA pipe (an add, a multiply), special-function
  calls (exp, tanh, ...: the SFU), tensor-core operations (2 x M x N x K per mma), integer
  and logic operations, per active thread.

`tk-codegen --report` interprets sampled blocks of each kernel (tilekit.codegen.report), so
kernel quality can be judged without a GPU. Kernels whose blocks wait on each other
(progress counters, grid barriers) are not interpreted: blocks run one after another here.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from tilekit.errors import InternalError, TilekitError
from tilekit.tile.expr import (HALF, INT_DTYPES, Addr, Binary, Call, Cast, Const, Expr, Load,
                               Select, Unary, Var, children as _expr_children)
from tilekit.tile.functions import TMA_LOADS, TMA_STORES, WGMMA
from tilekit.tile.nodes import (Alloc, Assign, Barrier, Break, Buffer, CallBody, Comment,
                                Continue, Copy, Decl, Evaluate, For, If, Kernel, Let, Seq, Stmt,
                                Store, Switch, Threads, While, calls_any, exprs, walk)

#: Hopper intrinsics with no effect here: fences, register budgets, the wgmma batch and bulk
#: store bookkeeping (wgmma and TMA stores run when issued), named barriers (a role's threads
#: run in step).
HOPPER_NOOPS = frozenset({"mbar_fence_init", "wgmma_fence", "wgmma_commit", "wgmma_wait",
                          "setmaxnreg_inc", "setmaxnreg_dec", "bulk_commit", "bulk_wait",
                          "bulk_wait_read", "fence_proxy_async", "named_barrier"})

WARP = 32
SECTOR = 32
BANKS = 32
#: Functions that run on the special-function unit.
SFU = frozenset({"exp", "log", "tanh", "erf", "sqrt", "rsqrt", "sigmoid", "sin", "cos", "tan",
                 "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "pow"})


def np_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    if dtype == "ptr":
        return np.dtype(np.int64)
    if dtype == "float4":
        return np.dtype(np.float32)
    return np.dtype(dtype)


@dataclass
class Site:
    """One access site (a load or store of one buffer) and what its requests cost."""

    buffer: str
    scope: str
    kind: str                    # load | store
    requests: int = 0            # warp requests with at least one active lane
    sectors: int = 0             # global: 32-byte sectors touched
    ideal: int = 0               # global: the fewest sectors for the bytes moved
    wavefronts: int = 0          # shared: wavefronts the bank mapping needs
    ideal_wavefronts: int = 0    # shared: the fewest for the bytes moved

    @property
    def efficiency(self) -> float:
        """Useful fraction: ideal / actual (1.0 is conflict-free or fully coalesced)."""
        if self.scope == "global":
            return self.ideal / self.sectors if self.sectors else 1.0
        return self.ideal_wavefronts / self.wavefronts if self.wavefronts else 1.0

    def record(self) -> dict:
        out = {"buffer": self.buffer, "scope": self.scope, "kind": self.kind,
               "requests": self.requests}
        if self.scope == "global":
            out.update(sectors=self.sectors, ideal_sectors=self.ideal,
                       sectors_per_request=round(self.sectors / max(self.requests, 1), 3))
        else:
            out.update(wavefronts=self.wavefronts, ideal_wavefronts=self.ideal_wavefronts,
                       conflict_degree=round(self.wavefronts / max(self.ideal_wavefronts, 1),
                                             3))
        return out


@dataclass
class Counters:
    """What the interpreted blocks did (module docstring)."""

    blocks: int = 0
    sites: dict = field(default_factory=dict)     # id(node) -> Site
    flops: int = 0               # FMA-pipe floating-point operations
    sfu: int = 0                 # special-function calls
    tensor_flops: int = 0        # tensor-core operations (2 x M x N x K per mma)
    int_ops: int = 0
    #: barriers a block met right after staging global data into shared memory with
    #: ordinary loads (a round trip it waits for; cp.async pipelines overlap theirs)
    stage_waits: int = 0

    def site(self, node, buffer: Buffer, kind: str) -> Site:
        key = (id(node), kind)
        if key not in self.sites:
            self.sites[key] = Site(buffer.name, buffer.scope, kind)
        return self.sites[key]

    def totals(self) -> dict:
        g = [s for s in self.sites.values() if s.scope == "global"]
        sh = [s for s in self.sites.values() if s.scope == "shared"]
        sectors, ideal = sum(s.sectors for s in g), sum(s.ideal for s in g)
        waves, ideal_w = sum(s.wavefronts for s in sh), sum(s.ideal_wavefronts for s in sh)
        return {"blocks": self.blocks, "global_requests": sum(s.requests for s in g),
                "global_sectors": sectors, "global_ideal_sectors": ideal,
                "coalescing": round(ideal / sectors, 4) if sectors else 1.0,
                "shared_requests": sum(s.requests for s in sh), "shared_wavefronts": waves,
                "shared_ideal_wavefronts": ideal_w,
                "bank_conflict_degree": round(waves / ideal_w, 4) if ideal_w else 1.0,
                "flops": self.flops, "sfu": self.sfu, "tensor_flops": self.tensor_flops,
                "int_ops": self.int_ops, "stage_waits": self.stage_waits}


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Interpreter:
    """Runs one kernel's blocks on `memory` (global buffer name -> flat NumPy array, written
    in place), counting (module docstring)."""

    def __init__(self, kernel: Kernel, memory: Mapping[str, np.ndarray],
                 counters: Counters | None = None) -> None:
        self.kernel = kernel
        self.memory = dict(memory)
        self.counters = counters or Counters()
        self.compiled: dict[int, Callable] = {}
        for t in kernel.tables:
            self.memory[t.name] = np.asarray(t.values, dtype=np.int32)

    # -- running --------------------------------------------------------------------------
    def run(self, blocks=None) -> Counters:
        if self.kernel.grid_sync or self._waits():
            raise TilekitError(f"kernel {self.kernel.name}: its blocks wait on each other; the "
                               "interpreter runs blocks one after another",
                               "--report", "interpret its bodies (the kernels it composes)")
        for block in (range(self.kernel.grid) if blocks is None else blocks):
            self.run_block(self.kernel, int(block), self.kernel.grid,
                           np.zeros(max(self.kernel.smem_bytes, 16), np.uint8))
            self.counters.blocks += 1
        return self.counters

    def _waits(self) -> bool:
        """Do its blocks wait on each other (a tk-ram program's progress counters, read in a
        spin)? Counters only added to (a split-K kernel's slices done per tile) run here
        block after block as on the device."""
        return bool(self.kernel.calls) or calls_any(self.kernel, ("spin",))

    def run_block(self, k: Kernel, block: int, nblocks: int, smem: np.ndarray) -> None:
        env = {"tk_block": np.int32(block), "tk_nblocks": np.int32(nblocks)}
        env.update({m.name: m for m in k.tensor_maps})      # TMA descriptors
        frame = _Frame(self, k, smem, k.threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                frame.stmt(k.body, env, None)


class _Frame:
    """One block of one kernel: its buffers and how statements run on them."""

    def __init__(self, interp: Interpreter, k: Kernel, smem: np.ndarray, threads: int):
        self.interp, self.k, self.smem, self.threads = interp, k, smem, threads
        self.buffers: dict[str, Buffer] = {b.name: b for b in k.params + k.shared}
        for t in k.tables:
            self.buffers[t.name] = Buffer(t.name, "global", "int32", (len(t.values),))
        self.arrays: dict[str, np.ndarray] = {}
        for b in k.params:
            self.arrays[b.name] = interp.memory[b.name]
        for t in k.tables:
            self.arrays[t.name] = interp.memory[t.name]
        for b in k.shared:
            n = b.elements
            self.arrays[b.name] = smem[b.offset:b.offset + b.nbytes].view(np_dtype(b.dtype))[:n]
        self.counters = interp.counters
        self.staged = False          # a global -> shared copy since the last barrier
        self.asynchronous = False    # the kernel stages with cp.async
        #: the kernel waits on mbarriers: branches that split the block into roles (a
        #: producer and consumers) run as coroutines (`_Roles`)
        self.mbarriers = any(isinstance(x, Call) and x.fn == "mbar_wait"
                             for st in walk(k.body) for e in exprs(st) for x in _subexprs(e))
        self.roles: _Roles | None = None

    # -- statements -----------------------------------------------------------------------
    def stmt(self, s: Stmt, env: dict, mask) -> None:
        kind = type(s)
        if kind is Seq:
            for x in s.body:
                self.stmt(x, env, mask)
        elif kind is Let:
            env[s.var.name] = self.expr(s.value, env, mask)
        elif kind is Decl:
            value = self.expr(s.init, env, mask) if s.init is not None else np.zeros(
                (), np_dtype(s.var.dtype))
            env[s.var.name] = self._vector(value, mask, s.var.dtype)
        elif kind is Assign:
            value = self.expr(s.value, env, mask)
            env[s.var.name] = self._merge(env[s.var.name], value, mask, s.var.dtype)
        elif kind is Alloc:
            b = s.buffer
            self.buffers[b.name] = b
            # one copy per thread (the block-level code that declares it runs for all)
            self.arrays[b.name] = np.zeros((self.threads,) + tuple(b.shape),
                                           np_dtype(b.dtype))
        elif kind is Store:
            self.store(s, env, mask)
        elif kind is Evaluate:
            self.expr(s.call, env, mask)
        elif kind is For:
            self.loop(s, env, mask)
        elif kind is While:
            self.while_(s, env, mask)
        elif kind is If:
            self.branch(s, env, mask)
        elif kind is Switch:
            value = self.expr(s.value, env, mask)
            for case, body in s.cases:
                if mask is None:
                    if int(value) == case:
                        self.stmt(body, env, mask)
                        break
                else:
                    m = mask & (np.broadcast_to(value, mask.shape) == case)
                    if m.any():
                        self.stmt(body, env, m)
        elif kind is Threads:
            region = dict(env)
            region[s.var.name] = np.arange(self.threads, dtype=np.int32)
            active = np.arange(self.threads) < s.count
            self.stmt(s.body, region, active)
        elif kind is CallBody:
            self.call_body(s, env)
        elif kind is Barrier:
            if self.staged and not self.asynchronous:
                self.counters.stage_waits += 1
            self.staged = False
        elif kind is Comment:
            pass
        elif kind is Break:
            raise _Break()
        elif kind is Continue:
            raise _Continue()
        elif kind is Copy:
            raise InternalError("the interpreter runs lowered programs (a Copy is left)")
        else:  # pragma: no cover
            raise InternalError(f"cannot interpret {kind.__name__}")

    def _vector(self, value, mask, dtype: str):
        value = np.asarray(value).astype(np_dtype(dtype), copy=True)
        if mask is None:
            return value
        return np.broadcast_to(value, (self.threads,)).copy() if value.ndim == 0 else value

    def _merge(self, old, new, mask, dtype: str):
        new = np.asarray(new).astype(np_dtype(dtype))
        if mask is None:
            return new
        old = np.broadcast_to(np.asarray(old), (self.threads,))
        return np.where(mask, np.broadcast_to(new, (self.threads,)), old)

    def loop(self, s: For, env: dict, mask) -> None:
        start = self.expr(s.start, env, mask)
        stop = self.expr(s.stop, env, mask)
        step = self.expr(s.step, env, mask)
        name = s.var.name
        if mask is None or (np.ndim(start) == 0 and np.ndim(stop) == 0 and np.ndim(step) == 0):
            i = int(start)
            while i < int(stop):
                env[name] = np_dtype(s.var.dtype).type(i)
                try:
                    self.stmt(s.body, env, mask)
                except _Continue:
                    pass
                except _Break:
                    break
                i += int(step)
                stop = self.expr(s.stop, env, mask) if mask is None else stop
            return
        i = np.broadcast_to(np.asarray(start, np.int64), (self.threads,)).copy()
        stop_v = np.broadcast_to(np.asarray(stop, np.int64), (self.threads,))
        step_v = np.broadcast_to(np.asarray(step, np.int64), (self.threads,))
        live = mask & (i < stop_v)
        while live.any():
            env[name] = i.astype(np_dtype(s.var.dtype))
            self.stmt(s.body, env, live)
            i = i + step_v
            live = live & (i < stop_v)

    def while_(self, s: While, env: dict, mask) -> None:
        if mask is None:
            while bool(self.expr(s.cond, env, None)):
                try:
                    self.stmt(s.body, env, None)
                except _Continue:
                    continue
                except _Break:
                    break
            return
        live = mask & np.broadcast_to(self.expr(s.cond, env, mask), mask.shape)
        guard = 0
        while live.any():
            self.stmt(s.body, env, live)
            live = live & np.broadcast_to(self.expr(s.cond, env, live), mask.shape)
            guard += 1
            if guard > 10 ** 7:  # pragma: no cover - a spin with nobody to release it
                raise TilekitError(f"kernel {self.k.name}: a loop that does not end",
                                   "--report")

    def branch(self, s: If, env: dict, mask) -> None:
        cond = self.expr(s.cond, env, mask)
        if mask is None or np.ndim(cond) == 0:
            taken = bool(cond)
            if mask is not None and not mask.any():
                return
            if taken:
                self.stmt(s.then, env, mask)
            elif s.other is not None:
                self.stmt(s.other, env, mask)
            return
        cond = np.broadcast_to(cond, mask.shape)
        then = mask & cond
        other = mask & ~cond
        if self.mbarriers and s.other is not None and then.any() and other.any():
            # roles that wait on each other's mbarriers: neither branch may run to its end
            # first; they run as coroutines, switching at waits that are not yet satisfied
            self.run_roles([(s.then, dict(env), then), (s.other, dict(env), other)])
            return
        if then.any():
            self.stmt(s.then, env, then)
        if s.other is not None:
            if other.any():
                self.stmt(s.other, env, other)

    def run_roles(self, roles) -> None:
        if self.roles is not None:
            raise InternalError(f"kernel {self.k.name}: roles within roles are not interpreted")
        self.roles = _Roles(len(roles))
        try:
            self.roles.run([lambda body=body, env=env, mask=mask: self.stmt(body, env, mask)
                            for body, env, mask in roles])
        finally:
            self.roles = None

    def call_body(self, s: CallBody, env: dict) -> None:
        callee = self.k.callee(s.kernel)
        block = int(self.expr(s.block, env, None))
        nblocks = int(self.expr(s.nblocks, env, None))
        inner = Interpreter.__new__(Interpreter)
        inner.kernel, inner.counters, inner.compiled = callee, self.counters, {}
        inner.memory = {p.name: self.arrays[a] for p, a in zip(callee.params, s.args)}
        inner.run_block(callee, block, nblocks, self.smem)

    # -- memory ---------------------------------------------------------------------------
    def offsets(self, buffer: Buffer, index, env, mask):
        """Element offsets (flat, through the layout) of an index, per thread."""
        values = [np.asarray(self.expr(i, env, mask), dtype=np.int64) for i in index]
        if buffer.scope == "local":
            return values
        return np.asarray(self.expr(buffer.flat(tuple(index)), env, mask), dtype=np.int64)

    def load(self, e: Load, env: dict, mask):
        b = self.buffers[e.buffer]
        array = self.arrays[e.buffer]
        lanes = e.lanes
        if b.scope == "local":
            idx = [np.asarray(self.expr(i, env, mask), dtype=np.int64) for i in e.index]
            if lanes > 1:       # consecutive elements of the innermost dimension
                return np.stack([self.local_load(array, idx[:-1] + [idx[-1] + j], mask)
                                 for j in range(lanes)], axis=-1)
            return self.local_load(array, idx, mask)
        return self.memory_load(e, b, array, env, mask)

    def local_load(self, array, idx, mask):
        """Element `idx` of a local buffer per thread (thread 0's in block-level code)."""
        if mask is None:
            return array[(0, *[int(i) for i in idx])] if array.ndim == len(idx) + 1 \
                else array[tuple(int(i) for i in idx)]
        t = np.arange(self.threads)
        sel = tuple(np.broadcast_to(i, t.shape) for i in idx)
        safe = tuple(np.where(mask, i, 0) for i in sel)
        return array[(t, *safe)]

    def memory_load(self, e: Load, b: Buffer, array, env: dict, mask):
        lanes = e.lanes
        flat = self.offsets(b, e.index, env, mask)
        if mask is None:
            flat = np.asarray(flat)
            n = int(flat)
            if lanes > 1:
                return array[n:n + lanes].copy()
            return array[n] if 0 <= n < array.shape[0] else array.dtype.type(0)
        flat = np.broadcast_to(flat, mask.shape)
        self.count(e, b, "load", flat, mask, lanes)
        safe = np.where(mask, flat, 0)
        if lanes > 1:
            out = np.zeros((self.threads, lanes), array.dtype)
            for j in range(lanes):
                ok = mask & (safe + j < array.shape[0])
                out[:, j] = np.where(ok, array[np.where(ok, safe + j, 0)], 0)
            return out
        inside = mask & (safe >= 0) & (safe < array.shape[0])
        if (mask & ~inside).any():
            raise TilekitError(f"kernel {self.k.name}: a load of {e.buffer} outside it "
                               f"(element {int(flat[mask & ~inside][0])} of "
                               f"{array.shape[0]})", "--report", "a kernel bug: report it")
        return array[np.where(inside, safe, 0)]

    def store(self, s: Store, env: dict, mask) -> None:
        b = self.buffers[s.buffer]
        array = self.arrays[s.buffer]
        value = self.expr(s.value, env, mask)
        if b.scope == "local":
            idx = [np.asarray(self.expr(i, env, mask), dtype=np.int64) for i in s.index]
            if s.lanes > 1:     # consecutive elements of the innermost dimension
                lanes = np.broadcast_to(np.asarray(value), np.shape(value)[:-1] + (s.lanes,)) \
                    if np.ndim(value) else np.full(s.lanes, value)
                for j in range(s.lanes):
                    self.local_store(array, idx[:-1] + [idx[-1] + j], lanes[..., j], mask)
                return
            self.local_store(array, idx, value, mask)
            return
        self.memory_store(s, b, array, value, env, mask)

    def local_store(self, array, idx, value, mask) -> None:
        """Element `idx` of a local buffer, for the active threads (all in block-level code)."""
        if mask is None:
            array[(slice(None), *[int(i) for i in idx])] = value
            return
        t = np.nonzero(mask)[0]
        sel = tuple(np.broadcast_to(i, mask.shape)[t] for i in idx)
        array[(t, *sel)] = np.broadcast_to(np.asarray(value), (self.threads,) + np.shape(
            value)[1:])[t] if np.ndim(value) else value

    def memory_store(self, s: Store, b: Buffer, array, value, env: dict, mask) -> None:
        flat = self.offsets(b, s.index, env, mask)
        if mask is None:
            n = int(flat)
            if s.lanes > 1:
                array[n:n + s.lanes] = value
            else:
                array[n] = value
            return
        flat = np.broadcast_to(flat, mask.shape)
        self.count(s, b, "store", flat, mask, s.lanes)
        if b.scope == "shared" and _reads_global(s.value, self.buffers):
            self.staged = True
        t = np.nonzero(mask)[0]
        if s.lanes > 1:
            v = np.broadcast_to(np.asarray(value), (self.threads, s.lanes))
            for j in range(s.lanes):
                array[flat[t] + j] = v[t, j]
            return
        v = np.broadcast_to(np.asarray(value), mask.shape)
        if (flat[t] < 0).any() or (flat[t] >= array.shape[0]).any():
            raise TilekitError(f"kernel {self.k.name}: a store into {s.buffer} outside it",
                               "--report", "a kernel bug: report it")
        array[flat[t]] = v[t].astype(array.dtype)

    def count(self, node, b: Buffer, kind: str, flat, mask, lanes: int) -> None:
        """Sectors per warp request (global) or wavefronts (shared), for the active lanes."""
        if b.scope not in ("global", "shared") or b.name in {t.name for t in self.k.tables}:
            return
        site = self.counters.site(node, b, kind)
        item = np.dtype(np_dtype(b.dtype)).itemsize
        width = item * lanes
        addr = flat.astype(np.int64) * item
        for w in range(0, self.threads, WARP):
            m = mask[w:w + WARP]
            if not m.any():
                continue
            a = addr[w:w + WARP][m]
            site.requests += 1
            if b.scope == "global":
                first = a // SECTOR
                last = (a + width - 1) // SECTOR
                touched = set(first.tolist()) | set(last.tolist())
                site.sectors += len(touched)
                site.ideal += max(1, -(-len(np.unique(a)) * width // SECTOR))
            else:
                site.wavefronts += _wavefronts(a, width)
                # The fewest: the unique bytes over 128 per wavefront, and at least one per
                # phase: a wavefront returns 128 bytes to the registers (one 4-byte register
                # per lane), so a 16-byte access takes a quarter warp at a time even when
                # lanes share an address (a broadcast).
                phases = -(-len(a) // max(1, (BANKS * 4) // max(width, 4)))
                site.ideal_wavefronts += max(1, phases,
                                             -(-len(np.unique(a)) * width // (BANKS * 4)))

    # -- expressions ----------------------------------------------------------------------
    def expr(self, e: Expr, env: dict, mask):
        kind = type(e)
        if kind is Const:
            return np_dtype(e.dtype).type(e.value) if e.dtype != "float4" else \
                np.full(4, e.value, np.float32)
        if kind is Var:
            return env[e.name]
        if kind is Load:
            return self.load(e, env, mask)
        if kind is Binary:
            return self.binary(e, env, mask)
        if kind is Unary:
            a = self.expr(e.arg, env, mask)
            if e.op == "-":
                return np.negative(a).astype(np_dtype(e.dtype)) if e.dtype != "bool" else ~a
            if e.op == "!":
                return np.logical_not(a)
            return np.invert(a)
        if kind is Cast:
            return self.cast(self.expr(e.arg, env, mask), e.arg.dtype, e.dtype)
        if kind is Select:
            cond = self.expr(e.cond, env, mask)
            if np.ndim(cond) == 0 and mask is None:
                return self.expr(e.then if bool(cond) else e.other, env, mask)
            cm = np.broadcast_to(cond, (self.threads,)) if mask is not None else cond
            base = mask if mask is not None else np.ones(self.threads, bool)
            a = self.expr(e.then, env, base & cm) if (base & cm).any() else \
                np_dtype(e.dtype).type(0)
            b = self.expr(e.other, env, base & ~cm) if (base & ~cm).any() else \
                np_dtype(e.dtype).type(0)
            if e.dtype == "float4":     # 4 lanes per thread
                def lanes4(v):
                    v = np.asarray(v, np.float32)
                    return np.broadcast_to(v if v.ndim else np.full(4, v), (self.threads, 4))
                return np.where(np.broadcast_to(cm, (self.threads,))[:, None], lanes4(a),
                                lanes4(b))
            return np.where(cm, a, b).astype(np_dtype(e.dtype))
        if kind is Call:
            return self.call(e, env, mask)
        if kind is Addr:
            return e
        raise InternalError(f"cannot interpret expression {e!r}")  # pragma: no cover

    def _active(self, mask) -> int:
        return self.threads if mask is None else int(np.count_nonzero(mask))

    def binary(self, e: Binary, env: dict, mask):
        a = self.expr(e.lhs, env, mask)
        b = self.expr(e.rhs, env, mask)
        op = e.op
        dt = np_dtype(e.dtype) if e.dtype != "bool" else None
        if e.dtype in ("float32", "float64") and op in ("+", "-", "*", "/"):
            self.counters.flops += self._active(mask)
        elif op in ("+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>"):
            self.counters.int_ops += self._active(mask)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return {"<": np.less, "<=": np.less_equal, ">": np.greater,
                    ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}[op](a, b)
        if op == "&&":
            return np.logical_and(a, b)
        if op == "||":
            return np.logical_or(a, b)
        a = np.asarray(a).astype(dt)
        b = np.asarray(b).astype(dt)
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            if e.dtype in INT_DTYPES:
                q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
                return (np.sign(a) * np.sign(b) * q).astype(dt)
            return a / b
        if op == "%":
            if e.dtype in INT_DTYPES:
                q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
                return (a - b * (np.sign(a) * np.sign(b) * q)).astype(dt)
            return np.fmod(a, b)
        if op == "&":
            return a & b
        if op == "|":
            return a | b
        if op == "^":
            return a ^ b
        if op == "<<":
            return a << b
        if op == ">>":
            return a >> b
        raise InternalError(f"cannot interpret operator {op}")  # pragma: no cover

    @staticmethod
    def cast(value, src: str, dst: str):
        value = np.asarray(value)
        if dst == "bool":
            return value != 0
        target = np_dtype(dst)
        if dst in INT_DTYPES and src in ("float16", "bfloat16", "float32", "float64"):
            return np.trunc(value.astype(np.float64)).astype(target)
        if dst in HALF:
            return value.astype(np.float32).astype(target)
        return value.astype(target)

    def call(self, e: Call, env: dict, mask):
        from tilekit.tile.functions import FUNCTIONS, NUMPY

        fn = e.fn
        f = FUNCTIONS[fn]
        if f.family == "intrinsic":
            return self.intrinsic(e, env, mask)
        if f.family == "warp":
            value = np.broadcast_to(self.expr(e.args[0], env, mask), (self.threads,))
            lanes = int(e.args[1].value)
            groups = value.reshape(-1, lanes)
            reducer = {"warp_sum": np.sum, "warp_prod": np.prod, "warp_max": np.max,
                       "warp_min": np.min}[fn]
            if fn in ("warp_max", "warp_min") and value.dtype.kind == "f":
                reducer = {"warp_max": np.max, "warp_min": np.min}[fn]
            out = reducer(groups, axis=1, keepdims=True).astype(value.dtype)
            return np.broadcast_to(out, groups.shape).reshape(-1)
        args = [self.expr(a, env, mask) for a in e.args]
        if fn in SFU:
            self.counters.sfu += self._active(mask)
        elif e.dtype in ("float32", "float64") and fn in ("max", "min", "abs"):
            self.counters.flops += self._active(mask)
        args = [np.asarray(a) for a in args]
        out = NUMPY[fn](*args)
        return np.asarray(out).astype(np_dtype(e.dtype)) if e.dtype != "bool" else out

    # -- intrinsics ----------------------------------------------------------------------
    def address(self, a: Addr, env, mask):
        """(buffer, per-thread element offsets) of an address argument."""
        b = self.buffers[a.buffer]
        if b.scope == "local":
            return b, [np.broadcast_to(np.asarray(self.expr(i, env, mask), dtype=np.int64),
                                       (self.threads,)) for i in a.index]
        return b, np.broadcast_to(self.offsets(b, a.index, env, mask), (self.threads,))

    def intrinsic(self, e: Call, env: dict, mask):
        fn = e.fn
        m = mask if mask is not None else np.ones(self.threads, bool)
        if fn in ("cp_async_commit", "cp_async_wait", "threadfence", "spin", "grid_sync"):
            return np.int32(0)
        if fn == "atomic_add":      # the active threads one after another; each gets the old
            dst, value = e.args
            db, doff = self.address(dst, env, mask)
            add = np.broadcast_to(np.asarray(self.expr(value, env, mask)), m.shape)
            arr = self.arrays[db.name]
            old = np.zeros(self.threads, dtype=arr.dtype)
            for t in np.nonzero(m)[0]:
                at = int(doff[t])
                old[t] = arr[at]
                arr[at] = arr[at] + add[t]
            self.count(dst, db, "store", doff, m, 1)
            return old
        if fn == "cp_async16":
            self.asynchronous = True
            dst, src, valid = e.args
            db, doff = self.address(dst, env, mask)
            sb, soff = self.address(src, env, mask)
            ok = np.broadcast_to(self.expr(valid, env, mask), m.shape) & m
            item = np_dtype(db.dtype).itemsize
            n = 16 // item
            darr, sarr = self.arrays[db.name], self.arrays[sb.name]
            self.count(src, sb, "load", soff, ok, n)
            self.count(dst, db, "store", doff, m, n)
            for t in np.nonzero(m)[0]:
                d = int(doff[t])
                if ok[t]:
                    s = int(soff[t])
                    darr[d:d + n] = sarr[s:s + n]
                else:
                    darr[d:d + n] = 0
            return np.int32(0)
        if fn == "to_tf32":
            x = np.asarray(self.expr(e.args[0], env, mask), np.float32)
            u = x.view(np.uint32).copy()
            finite = (u & 0x7F800000) != 0x7F800000
            u = np.where(finite, (u + 0x1000) & 0xFFFFE000, u)
            return u.astype(np.uint32)
        if fn == "pack16":
            lo, hi = (np.asarray(self.expr(a, env, mask)).astype(np.uint32) for a in e.args)
            return (lo & 0xFFFF) | (hi << 16)
        if fn in ("ldmatrix_x4", "ldmatrix_x4_trans"):
            return self.ldmatrix(e, env, m, fn.endswith("trans"))
        if fn.startswith("mma_"):
            return self.mma(e, env, m)
        if fn in HOPPER_NOOPS:
            return np.int32(0)
        if fn.startswith("mbar_"):
            return self.mbarrier(e, env, mask, m)
        if fn in TMA_LOADS:
            return self.tma_load(e, env, mask, m)
        if fn in TMA_STORES:
            return self.tma_store(e, env, mask, m)
        if fn == "wgmma_desc":
            addr, lbo, sbo = e.args
            b, off = self.address(addr, env, mask)
            start = (b.offset + off.astype(np.int64) * np_dtype(b.dtype).itemsize)
            lbo, sbo = (np.asarray(self.expr(x, env, mask), np.int64) for x in (lbo, sbo))
            return (((start & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16)
                    | (((sbo & 0x3FFFF) >> 4) << 32) | (1 << 62)).astype(np.int64)
        if fn in WGMMA:
            return self.wgmma(e, env, m)
        raise TilekitError(f"kernel {self.k.name}: {fn} is not interpreted (its blocks wait on "
                           "each other)", "--report", "interpret its bodies instead")

    def ldmatrix(self, e: Call, env, m, trans: bool):
        """Four 8x8 b16 matrices; lane L gives row L % 8 of matrix L / 8 and receives row
        g, columns 2t..2t+1 of each (with .trans: rows 2t..2t+1, column g)."""
        dst, src = e.args
        fb, fidx = self.address(dst, env, None)
        sb, soff = self.address(src, env, None)
        sarr = self.arrays[sb.name].view(np.uint16)
        out = self.arrays[fb.name]
        self._count_ldmatrix(src, sb, soff, m)
        for w in range(0, self.threads, WARP):
            rows = soff[w:w + WARP]
            for lane in range(WARP):
                t = w + lane
                if not m[t]:
                    continue
                g, q = lane // 4, lane % 4
                regs = []
                for i in range(4):
                    if trans:
                        lo = sarr[rows[8 * i + 2 * q] + g]
                        hi = sarr[rows[8 * i + 2 * q + 1] + g]
                    else:
                        base = rows[8 * i + g]
                        lo, hi = sarr[base + 2 * q], sarr[base + 2 * q + 1]
                    regs.append(np.uint32(lo) | (np.uint32(hi) << 16))
                index = tuple(int(i[t]) for i in fidx)
                out[(t, *index)] = np.asarray(regs, np.uint32)
        return np.int32(0)

    def _count_ldmatrix(self, node, b: Buffer, offsets, m) -> None:
        """ldmatrix serves one 8x8 matrix (eight rows of 16 bytes, one from each of 8 lanes)
        per wavefront when the rows fall in distinct banks."""
        site = self.counters.site(node, b, "load")
        item = np_dtype(b.dtype).itemsize
        for w in range(0, self.threads, WARP):
            if not m[w:w + WARP].any():
                continue
            site.requests += 1
            addr = offsets[w:w + WARP].astype(np.int64) * item
            for i in range(4):
                site.wavefronts += _wavefronts(addr[8 * i:8 * i + 8], 16)
                site.ideal_wavefronts += 1

    def mma(self, e: Call, env, m):
        """D (16x8) += A B per warp, by the fragment layouts of the PTX ISA."""
        d, a, b = e.args
        kind = e.fn
        db, didx = self.address(d, env, None)
        ab, aidx = self.address(a, env, None)
        bb, bidx = self.address(b, env, None)
        D, A, B = self.arrays[db.name], self.arrays[ab.name], self.arrays[bb.name]
        K = 8 if kind.endswith("tf32") else 16
        half = "bfloat16" if kind.endswith("bf16") else "float16"
        for w in range(0, self.threads, WARP):
            if not m[w:w + WARP].any():
                continue
            self.counters.tensor_flops += 2 * 16 * 8 * K
            Am = np.zeros((16, 16), np.float64)
            Bm = np.zeros((16, 8), np.float64)
            frag = []
            for lane in range(WARP):
                t = w + lane
                fa = A[(t, *[int(i[t]) for i in aidx])]
                fb = B[(t, *[int(i[t]) for i in bidx])]
                frag.append((fa, fb))
            for lane, (fa, fb) in enumerate(frag):
                g, q = lane // 4, lane % 4
                if K == 8:
                    va = np.asarray(fa, np.uint32).view(np.float32)
                    vb = np.asarray(fb, np.uint32).view(np.float32)
                    Am[g, q], Am[g + 8, q], Am[g, q + 4], Am[g + 8, q + 4] = va
                    Bm[q, g], Bm[q + 4, g] = vb
                else:
                    ua = _halves(fa, half)
                    ub = _halves(fb, half)
                    Am[g, 2 * q:2 * q + 2] = ua[0]
                    Am[g + 8, 2 * q:2 * q + 2] = ua[1]
                    Am[g, 2 * q + 8:2 * q + 10] = ua[2]
                    Am[g + 8, 2 * q + 8:2 * q + 10] = ua[3]
                    Bm[2 * q:2 * q + 2, g] = ub[0]
                    Bm[2 * q + 8:2 * q + 10, g] = ub[1]
            C = Am[:, :K] @ Bm[:K, :]
            for lane in range(WARP):
                t = w + lane
                g, q = lane // 4, lane % 4
                index = (t, *[int(i[t]) for i in didx])
                acc = D[index]
                acc[0] += C[g, 2 * q]
                acc[1] += C[g, 2 * q + 1]
                acc[2] += C[g + 8, 2 * q]
                acc[3] += C[g + 8, 2 * q + 1]
        return np.int32(0)


    # -- Hopper: mbarriers, TMA, wgmma --------------------------------------------------------
    # The semantics of host_emul.h and host_emul.cpp (their comments have the details): an
    # mbarrier's state in its 8 bytes of shared memory, TMA copies complete when issued, shared
    # addresses swizzled on their bits 4-6 by bits 7-9 (the block's shared base counts as
    # aligned). wgmma runs when issued, for every active warpgroup at once (the interpreter
    # runs a region's threads in step, so a batch is complete at its commit).
    def _u16(self) -> np.ndarray:
        return self.smem[:self.smem.shape[0] // 2 * 2].view(np.uint16)

    def _bar_bytes(self, addr: Addr, env, mask, m) -> np.ndarray:
        b, off = self.address(addr, env, mask)
        return (b.offset + off.astype(np.int64) * np_dtype(b.dtype).itemsize)

    def _bar(self, at: int) -> list[int]:
        if at % 8:
            raise TilekitError(f"kernel {self.k.name}: an mbarrier not 8-byte aligned",
                               "--report", "a kernel bug: report it")
        w = int(self.smem[at:at + 8].view(np.uint64)[0])
        tx = (w >> 40) & 0x7FFFFF
        if tx & 0x400000:
            tx -= 0x800000
        return [w & 0xFFFFF, (w >> 20) & 0xFFFFF, tx, w >> 63]   # pending, expected, tx, phase

    def _bar_write(self, at: int, state: list[int]) -> None:
        pending, expected, tx, phase = state
        if pending == 0 and tx == 0:
            phase ^= 1
            pending = expected
        w = pending | (expected << 20) | ((tx & 0x7FFFFF) << 40) | (phase << 63)
        self.smem[at:at + 8] = np.frombuffer(np.uint64(w).tobytes(), np.uint8)
        if self.roles is not None:
            self.roles.version += 1

    def _bar_arrive(self, at: int, count: int, tx: int) -> None:
        state = self._bar(at)
        if state[0] < count:
            raise TilekitError(f"kernel {self.k.name}: an mbarrier arrival beyond the expected "
                               "count", "--report", "a kernel bug: report it")
        state[0] -= count
        state[2] += tx
        if state[2] < 0:
            raise TilekitError(f"kernel {self.k.name}: more bytes completed on an mbarrier than "
                               "expect_tx announced", "--report", "a kernel bug: report it")
        self._bar_write(at, state)

    def mbarrier(self, e: Call, env, mask, m):
        fn = e.fn
        at = self._bar_bytes(e.args[0], env, mask, m)
        active = np.nonzero(m)[0]
        if fn == "mbar_init":
            count = np.broadcast_to(self.expr(e.args[1], env, mask), m.shape)
            for t in active:
                self._bar_write(int(at[t]), [int(count[t]), int(count[t]), 0, 0])
            return np.int32(0)
        if fn in ("mbar_arrive", "mbar_expect_tx"):
            tx = np.broadcast_to(self.expr(e.args[1], env, mask), m.shape) \
                if fn == "mbar_expect_tx" else np.zeros(m.shape, np.int64)
            for t in active:
                self._bar_arrive(int(at[t]), 1, int(tx[t]))
            return np.int32(0)
        if fn == "mbar_wait":
            parity = np.broadcast_to(self.expr(e.args[1], env, mask), m.shape)

            def ready() -> bool:
                return all(self._bar(int(at[t]))[3] != (int(parity[t]) & 1) for t in active)
            if not ready():
                if self.roles is None:
                    raise TilekitError(f"kernel {self.k.name}: an mbarrier wait that nothing "
                                       "can satisfy (a deadlock)", "--report",
                                       "a kernel bug: report it")
                self.roles.block_until(ready, self.k.name)
            return np.int32(0)
        raise InternalError(f"cannot interpret {fn}")  # pragma: no cover

    def _tma_boxes(self, e: Call, tm, start, coords, m, what: str):
        """Per active thread of a TMA copy: the box's elements inside the tensor (a mask),
        their element indices in the tensor and their byte addresses in shared memory
        (swizzled), for `tm`'s box at the thread's coordinates; the copy's sectors counted
        at its site."""
        item = np_dtype(tm.dtype).itemsize
        grids = np.meshgrid(*[np.arange(n) for n in reversed(tm.box)], indexing="ij")
        rel = [g.reshape(-1) for g in reversed(grids)]          # innermost first, row-major
        rows = math.prod(tm.box[1:])
        row_bytes = tm.box[0] * item
        local = np.arange(rows * tm.box[0], dtype=np.int64)
        strides = (item,) + tuple(tm.strides)
        for t in np.nonzero(m)[0]:
            if int(start[t]) % 128:
                raise TilekitError(f"kernel {self.k.name}: a TMA {what} not 128-byte "
                                   "aligned", "--report", "a kernel bug: report it")
            pos = [int(c[t]) + r for c, r in zip(coords, rel)]
            inside = np.ones(local.shape, bool)
            offset = np.zeros(local.shape, np.int64)
            for d in range(len(coords)):
                inside &= (pos[d] >= 0) & (pos[d] < tm.dims[d])
                offset += np.where(inside, pos[d], 0) * strides[d]
            addr = int(start[t]) + (local // tm.box[0]) * row_bytes + (local % tm.box[0]) * item
            if tm.swizzle == 128:
                addr = _swizzle128(addr)
            site = self.counters.site(e, Buffer(tm.buffer, "global", tm.dtype, (0,)),
                                      "load" if what == "destination" else "store")
            site.requests += 1
            site.sectors += rows * -(-row_bytes // SECTOR)
            site.ideal += rows * -(-row_bytes // SECTOR)
            yield t, inside, offset // item, addr // item, rows * row_bytes

    def tma_load(self, e: Call, env, mask, m):
        """The box at the coordinates into shared memory, swizzled, zeros outside the
        tensor; its bytes complete on the barrier (host_emul.cpp's tma_load)."""
        dst, tmap, bar = e.args[:3]
        at = self._bar_bytes(bar, env, mask, m)
        tm, start, coords, bits, dst_bits = self._tma_operands(
            tmap, dst, e.args[3:3 + TMA_LOADS[e.fn]], env, mask, m)
        for t, inside, element, slot, nbytes in self._tma_boxes(e, tm, start, coords, m,
                                                                "destination"):
            dst_bits[slot] = np.where(inside, bits[np.where(inside, element, 0)], 0)
            self._bar_arrive(int(at[t]), 0, -nbytes)
        return np.int32(0)

    def _tma_operands(self, tmap, shared, coords, env, mask, m):
        """A bulk tensor copy's operands: its tensor map, the shared address's byte start per
        thread, the box coordinates, and the tensor's and shared memory's elements as bit
        patterns of the map's element size."""
        tm = self.expr(tmap, env, mask)
        b, off = self.address(shared, env, mask)
        start = b.offset + off.astype(np.int64) * np_dtype(b.dtype).itemsize
        coords = [np.broadcast_to(np.asarray(self.expr(c, env, mask), np.int64), m.shape)
                  for c in coords]
        item = np_dtype(tm.dtype).itemsize
        bits = self.arrays[tm.buffer].view(
            {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[item])
        return tm, start, coords, bits, self.smem[:self.smem.shape[0] // item * item].view(
            bits.dtype)

    def tma_store(self, e: Call, env, mask, m):
        """The map's box from shared memory (swizzled) to the tensor, elements outside it
        skipped (host_emul.cpp's tma_store), at once."""
        tmap, src = e.args[:2]
        tm, start, coords, bits, src_bits = self._tma_operands(
            tmap, src, e.args[2:2 + TMA_STORES[e.fn]], env, mask, m)
        for _, inside, element, slot, _ in self._tma_boxes(e, tm, start, coords, m,
                                                           "store source"):
            bits[element[inside]] = src_bits[slot[inside]]
        return np.int32(0)

    def _operand(self, desc: int, trans: int, mn: int, item: int = 2) -> np.ndarray:
        """A wgmma operand (mn x 32 bytes of k: 16 16-bit or 8 32-bit patterns) through its
        descriptor (host_emul.cpp's desc_element)."""
        if desc >> 62 != 1 or (desc >> 49) & 7:
            raise TilekitError(f"kernel {self.k.name}: a wgmma descriptor without the "
                               "128-byte swizzle or with a base offset", "--report",
                               "a kernel bug: report it")
        start, lbo, sbo = ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4,
                           ((desc >> 32) & 0x3FFF) << 4)
        i, k = np.meshgrid(np.arange(mn, dtype=np.int64), np.arange(32 // item, dtype=np.int64),
                           indexing="ij")
        if trans:
            a = start + (i // 64) * lbo + ((i // 8) % 8) * 16 + (i % 8) * 2 + (k // 8) * sbo \
                + (k % 8) * 128
        else:
            a = start + (i // 8) * sbo + (i % 8) * 128 + k * item
        a = _swizzle128(a)
        words = self._u16() if item == 2 else \
            self.smem[:self.smem.shape[0] // 4 * 4].view(np.uint32)
        if (a // item >= words.shape[0]).any():
            raise TilekitError(f"kernel {self.k.name}: a wgmma operand outside shared memory",
                               "--report", "a kernel bug: report it")
        return words[a // item]

    def wgmma(self, e: Call, env, m):
        """D (64 x N) += A (64 x 16) B (16 x N) for every warpgroup with active threads, all
        of whose threads must be active (the accumulator layout of runtime.cuh's tk_wgmma)."""
        acc, da, db, n, ta, tb = e.args
        n, ta, tb = int(n.value), int(ta.value), int(tb.value)
        fb, fidx = self.address(acc, env, None)
        D = self.arrays[fb.name]
        da = np.broadcast_to(np.asarray(self.expr(da, env, None), np.int64), m.shape)
        db = np.broadcast_to(np.asarray(self.expr(db, env, None), np.int64), m.shape)
        item, depth = (4, 8) if e.fn == "wgmma_tf32" else (2, 16)

        def values(words):
            if item == 4:    # tf32: the tensor cores read the upper 19 bits of each word
                return (words & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
            half = np_dtype("bfloat16" if e.fn.endswith("bf16") else "float16")
            return words.view(half).astype(np.float64)
        for w in range(0, self.threads, 128):
            wm = m[w:w + 128]
            if not wm.any():
                continue
            if not wm.all():
                raise TilekitError(f"kernel {self.k.name}: wgmma by part of a warpgroup",
                                   "--report", "a kernel bug: report it")
            a0, b0 = int(da[w]), int(db[w])
            if (da[w:w + 128] != a0).any() or (db[w:w + 128] != b0).any():
                raise TilekitError(f"kernel {self.k.name}: a warpgroup's threads give wgmma "
                                   "different descriptors", "--report", "a kernel bug")
            A = values(self._operand(a0, ta, 64, item))
            B = values(self._operand(b0, tb, n, item))
            C = A @ B.T                                        # 64 x n
            self.counters.tensor_flops += 2 * 64 * n * depth
            site = self.counters.site(e, Buffer("wgmma_operands", "shared", "float16", (0,)),
                                      "load")
            site.requests += 1
            site.wavefronts += (64 + n) * 32 // 128
            site.ideal_wavefronts += (64 + n) * 32 // 128
            t = np.arange(128)
            warp, lane = t // 32, t % 32
            i = np.arange(n // 2)
            row = (16 * warp + lane // 4)[:, None] + 8 * ((i // 2) % 2)[None, :]
            col = (2 * (lane % 4))[:, None] + (8 * (i // 4) + i % 2)[None, :]
            for j in range(128):
                index = (w + j, *[int(x[w + j]) for x in fidx])
                D[index] += C[row[j], col[j]].astype(np.float32)
        return np.int32(0)


def _swizzle128(a):
    """The 128-byte swizzle of shared byte addresses: bits 4-6 XOR bits 7-9."""
    return a ^ (((a >> 7) & 7) << 4)


def _subexprs(e: Expr):
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(_expr_children(x))


class _Aborted(Exception):
    """Another role raised: this one stops at its next switch."""


class _Roles:
    """Branches that wait on each other's mbarriers, run as coroutines on threads: one runs
    at a time (a baton), switching only at a wait that is not yet satisfied (to the next role
    that can run); a wait still unsatisfied after every other role ran without changing any
    mbarrier is a deadlock. Deterministic: the switch points are the program's."""

    def __init__(self, n: int) -> None:
        self.cv = threading.Condition()
        self.turn = 0
        self.live = list(range(n))
        self.version = 0
        self.error: BaseException | None = None
        self.current = 0

    def run(self, bodies) -> None:
        workers = [threading.Thread(target=self._work, args=(i, body), daemon=True)
                   for i, body in enumerate(bodies)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if self.error is not None:
            raise self.error

    def _work(self, me: int, body) -> None:
        with self.cv:
            while self.turn != me and self.error is None:
                self.cv.wait()
        try:
            if self.error is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with np.errstate(all="ignore"):
                        body()
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            with self.cv:
                if self.error is None:
                    self.error = exc
        finally:
            with self.cv:
                self.live.remove(me)
                if self.live:
                    self.turn = self._after(me)
                self.cv.notify_all()

    def _after(self, me: int) -> int:
        later = [r for r in self.live if r > me]
        return later[0] if later else self.live[0]

    def block_until(self, ready, kernel: str) -> None:
        me = self.turn
        while not ready():
            seen = self.version
            with self.cv:
                self.turn = self._after(me)
                self.cv.notify_all()
                while self.turn != me and self.error is None:
                    self.cv.wait()
                if self.error is not None:
                    raise _Aborted()
            if not ready() and self.version == seen:
                raise TilekitError(f"kernel {kernel}: roles wait on mbarriers that none of "
                                   "them can complete (a deadlock)", "--report",
                                   "a kernel bug: report it")


def _reads_global(e: Expr, buffers) -> bool:
    from tilekit.tile.expr import loads
    return any(buffers[x.buffer].scope == "global" for x in loads(e) if x.buffer in buffers)


def _halves(regs, half: str):
    """Each 32-bit register as its two 16-bit values (low first), as float64."""
    out = []
    for r in np.asarray(regs, np.uint32).reshape(-1):
        pair = np.asarray([r & 0xFFFF, r >> 16], np.uint16).view(np_dtype(half))
        out.append(pair.astype(np.float64))
    return out


def _wavefronts(addresses: np.ndarray, width: int) -> int:
    """Wavefronts a shared-memory request needs: lanes served in phases (a whole warp for
    accesses of up to 4 bytes, a quarter warp for 16-byte ones); in each phase, per bank,
    the distinct 4-byte words addressed (the same word broadcasts)."""
    per_phase = max(1, (BANKS * 4) // max(width, 4))
    total = 0
    for p in range(0, len(addresses), per_phase):
        words: dict[int, set] = {}
        for a in addresses[p:p + per_phase].tolist():
            for w in range(a // 4, (a + max(width, 1) - 1) // 4 + 1):
                words.setdefault(w % BANKS, set()).add(w)
        total += max((len(v) for v in words.values()), default=0)
    return max(total, 1)


def interpret(kernel: Kernel, memory: Mapping[str, np.ndarray], blocks=None) -> Counters:
    """Run `kernel` (lowered) on `memory` for `blocks` (default: all); the counters."""
    return Interpreter(kernel, memory).run(blocks)


__all__ = ["Counters", "Interpreter", "Site", "interpret"]
