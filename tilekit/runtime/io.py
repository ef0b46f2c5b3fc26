"""Arrays in and out of a run: weights, inputs and outputs, and the checks on each.

Everything here raises `TilekitError` (exit 2) with the flag or file at fault and a hint:
a run never starts on data that does not match the module.

- budget: every tensor of a run together within `limits.TOTAL_BYTES`, checked before
  anything is allocated (`check_run_budget`);
- weights: the sidecar `.npz` named by `module.weights`, checksum verified before it is read,
  every weight tensor present with its declared shape and dtype, checked from each member's
  header before its data is read (`tilekit.runtime.arrays`);
- inputs: `--input NAME=@file.npy`, `--input NAME=1,2,3`, `--inputs file.npz`, or random with
  `--seed`; names, shapes, dtypes, integer ranges and finiteness checked against the module;
  random index inputs stay within the extent they index;
- outputs: a deterministic `.npz` (fixed member order and timestamps) written atomically.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from tilekit import limits
from tilekit.errors import TilekitError, UnsupportedError, excerpt
from tilekit.fileio import regular_file
from tilekit.ir.model import Module, Tensor
from tilekit.expr.ops import numpy_dtype  # noqa: F401 - re-exported
from tilekit.outputs import write_npz
from tilekit.runtime.arrays import npz_members, read_npy, read_npz

# -- dtypes ------------------------------------------------------------------------------

def describe(array: np.ndarray) -> str:
    """`float32[1,3,224,224]`: how messages name an array's type."""
    return f"{array.dtype}[{','.join(str(d) for d in array.shape)}]"


def describe_tensor(tensor: Tensor) -> str:
    return f"{tensor.dtype}[{','.join(str(d) for d in tensor.shape)}]"


# -- files -------------------------------------------------------------------------------

def base_dir(ir_path: str) -> Path:
    """The folder that relative paths in an IR document are relative to."""
    if ir_path in ("-", "<stdin>"):
        return Path.cwd()
    return Path(ir_path).resolve().parent


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_sidecar(ref: Mapping, key: str, folder: Path, where: str,
                    limit: limits.Limit = limits.TOTAL_BYTES) -> Path:
    """The path of a file referenced as `{key: relative path, sha256: hex}`, checksum verified:
    a regular file within `limit` bytes (never a FIFO or a device).

    `where` names the IR field (`weights`, `source`) in messages.
    """
    rel = ref.get(key) if isinstance(ref, Mapping) else None
    if not isinstance(rel, str) or not rel:
        raise TilekitError(f"has no '{key}' path", where,
                           f"expected {{{key}: relative/path, sha256: hex}}")
    path = (Path(folder) / rel) if not os.path.isabs(rel) else Path(rel)
    if not path.exists():
        raise TilekitError(f"file '{rel}' not found (looked in {folder})", f"{where}.{key}",
                           "paths in the IR are relative to the IR file's folder, or to the "
                           "current directory when the IR comes through stdin")
    regular_file(path, f"{where}.{key}", limit)
    expected = ref.get("sha256")
    if not isinstance(expected, str) or not expected:
        raise TilekitError("has no sha256 checksum", where,
                           "re-run tk-import to record one")
    actual = sha256_file(path)
    if actual != expected.lower():
        raise TilekitError(f"checksum mismatch for '{rel}': file has sha256 {actual[:16]}..., "
                           f"the IR expects {expected[:16]}...", f"{where}.sha256",
                           "the file changed after import; re-run tk-import on the model")
    return path


def _expect(module: Module, where: str, hint: str) -> Callable:
    """The header check of `tilekit.runtime.arrays` for arrays of `module`'s tensors."""
    def expect(name: str, shape: tuple[int, ...], dtype: np.dtype, _: str) -> None:
        tensor = module.tensors[name]
        check_header(shape, dtype, tensor, where.format(name=name), hint)
    return expect


def check_header(shape: tuple[int, ...], dtype: np.dtype, tensor: Tensor, where: str,
                 hint: str) -> None:
    """An array's shape and dtype (from its file header) must be the tensor's declaration."""
    got = f"{dtype}[{','.join(str(d) for d in shape[:8])}{',...' if len(shape) > 8 else ''}]"
    if tuple(shape) != tuple(tensor.shape):
        raise TilekitError(f"shape mismatch: expected {describe_tensor(tensor)}, got {got}",
                           where, hint)
    if dtype != numpy_dtype(tensor.dtype) and not (
            tensor.dtype == "bfloat16" and dtype in BFLOAT16_CARRIERS):
        raise TilekitError(f"dtype mismatch: expected {describe_tensor(tensor)}, got {got}",
                           where, hint)


#: How a bfloat16 array travels in .npy/.npz files, which have no bfloat16: its 16-bit
#: patterns as uint16 (what tilekit writes), or the raw 2-byte type ml_dtypes' arrays save as.
BFLOAT16_CARRIERS = (np.dtype(np.uint16), np.dtype("V2"))


def as_declared(array: np.ndarray, tensor: Tensor) -> np.ndarray:
    """An array read from a file, as its tensor's type (bfloat16 from its carrier)."""
    if tensor.dtype == "bfloat16" and array.dtype != numpy_dtype("bfloat16"):
        return array.view(numpy_dtype("bfloat16"))
    return array


# -- the run's budget -----------------------------------------------------------------

def run_bytes(module: Module) -> int:
    """The bytes of every tensor of `module` together: what a run holds at most."""
    return sum(t.size * numpy_dtype(t.dtype).itemsize for t in module.tensors.values())


def check_run_budget(module: Module, origin: str | None = None) -> None:
    """Refuse, before anything is allocated, a module whose tensors together are over
    `limits.TOTAL_BYTES`."""
    shown = "<stdin>" if origin in (None, "-") else origin
    limits.TOTAL_BYTES.check(run_bytes(module), f"{shown}: tensors",
                             "the module's tensors together")


# -- weights -----------------------------------------------------------------------------

def weight_names(module: Module) -> list[str]:
    return [name for name, t in module.tensors.items() if t.role == "weight"]


def load_weights(module: Module, folder: Path) -> dict[str, np.ndarray]:
    """Read and check the module's weights sidecar: checksum first, then every weight tensor.

    Returns `{tensor name: array}` for the tensors with role `weight`. A module without weight
    tensors needs no sidecar.
    """
    names = weight_names(module)
    if module.weights is None:
        if names:
            raise TilekitError(f"{len(names)} weight tensor(s) ({_first(names)}) but no "
                               "'weights' file", "weights",
                               "the IR must name its weights sidecar: re-run tk-import")
        return {}
    path = resolve_sidecar(module.weights, "file", folder, "weights")
    hint = "the sidecar does not match the IR: re-run tk-import"
    arrays = read_npz(path, f"weights.file ({path.name})", names,
                      _expect(module, "weights: tensor '{name}'", hint))
    for name in names:
        if name not in arrays:
            raise TilekitError(f"missing from '{path.name}'", f"weights: tensor '{name}'", hint)
    return {name: as_declared(arrays[name], module.tensors[name]) for name in names}


def check_array(array: np.ndarray, tensor: Tensor, where: str, hint: str) -> None:
    """Shape and dtype of `array` must be exactly the tensor's declaration."""
    if tuple(array.shape) != tuple(tensor.shape):
        raise TilekitError(f"shape mismatch: expected {describe_tensor(tensor)}, got "
                           f"{describe(array)}", where, hint)
    if array.dtype != numpy_dtype(tensor.dtype):
        raise TilekitError(f"dtype mismatch: expected {describe_tensor(tensor)}, got "
                           f"{describe(array)}", where, hint)


def _first(names: Iterable[str], n: int = 5) -> str:
    names = list(names)
    text = ", ".join(names[:n])
    return text + (f", ... ({len(names)} in all)" if len(names) > n else "")


# -- inputs ------------------------------------------------------------------------------

def parse_input_flag(text: str) -> tuple[str, str]:
    """Split one `--input` value into (name, value): `NAME=@file.npy` or `NAME=1,2,3`."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name or not value.strip():
        raise TilekitError(f"malformed value '{text}'", "--input",
                           "expected NAME=@file.npy or NAME=1,2,3")
    return name, value.strip()


def _parse_literal(value: str, tensor: Tensor, where: str) -> np.ndarray:
    dtype = numpy_dtype(tensor.dtype)
    items = [v.strip() for v in value.split(",")]
    try:
        if dtype == np.bool_:
            words = {"true": True, "false": False, "1": True, "0": False}
            values = [words[v.lower()] for v in items]
        elif dtype.kind in "iu":
            values = [int(v) if len(v) <= 40 else int("x") for v in items]
        else:
            values = [float(v) for v in items]
    except (KeyError, ValueError):
        kind = "bool" if dtype == np.bool_ else ("integer" if dtype.kind in "iu" else "number")
        raise TilekitError(f"cannot read {excerpt(value)} as {kind}s for "
                           f"{describe_tensor(tensor)}", where,
                           "expected comma-separated values, or NAME=@file.npy") from None
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        for v in values:
            if not info.min <= v <= info.max:
                raise TilekitError(f"value {excerpt(v)} is out of range for {tensor.dtype} "
                                   f"[{info.min}, {info.max}]", where,
                                   "give values the input's dtype can hold")
    else:
        wide = np.asarray(values, dtype=np.float64)
        with np.errstate(over="ignore"):
            held = wide.astype(dtype).astype(np.float64)
        over = np.isfinite(wide) & ~np.isfinite(held)
        if over.any():
            raise TilekitError(f"value {excerpt(values[int(np.argmax(over))])} is out of range "
                               f"for {tensor.dtype}", where,
                               "give values the input's dtype can hold (inf and nan are "
                               "written as such)")
    if len(values) == 1:
        return np.full(tensor.shape, values[0], dtype=dtype)
    if len(values) != tensor.size:
        raise TilekitError(f"{len(values)} values given, {describe_tensor(tensor)} needs "
                           f"{tensor.size} (or one value to fill it)", where,
                           "use NAME=@file.npy for larger inputs")
    return np.array(values, dtype=dtype).reshape(tensor.shape)


def gather_inputs(module: Module, flags: Iterable[str] = (), npz: str | None = None,
                  seed: int | None = None) -> dict[str, np.ndarray]:
    """Assemble the inputs of one run from the tk-run flags (not yet checked: see
    `check_inputs`).

    `npz` values come first, then `--input` flags override them by name; with `seed`, inputs
    that are still missing get random values (`random_input`).
    """
    inputs: dict[str, np.ndarray] = {}
    hint = "convert it first, e.g. numpy.asarray(x, dtype='{dtype}').reshape({shape})"
    if npz is not None:
        where = f"--inputs {npz}"
        if os.path.isdir(npz):
            raise TilekitError(f"'{npz}' is a directory, not an .npz archive", "--inputs",
                               "expected --inputs FILE.npz")
        members = npz_members(npz, where)
        names = {member: input_name(module, member, where) for member in members}
        arrays = read_npz(npz, where, list(members), _input_expect(module, names, hint))
        for member, array in arrays.items():
            inputs[names[member]] = as_declared(array, module.tensors[names[member]])
    given_by_flag: set[str] = set()
    for text in flags:
        name, value = parse_input_flag(text)
        where = f"--input {name}"
        name = input_name(module, name, where)
        if name in given_by_flag:
            raise TilekitError("given twice", where, "pass each input once")
        given_by_flag.add(name)
        if value.startswith("@"):
            path = value[1:]
            if os.path.isdir(path):
                raise TilekitError(f"'{path}' is a directory, not an .npy file", where,
                                   "expected NAME=@FILE.npy")
            inputs[name] = as_declared(read_npy(path, where, name, _input_expect(
                module, {name: name}, hint, where)), module.tensors[name])
        else:
            inputs[name] = _parse_literal(value, module.tensors[name], where)
    if seed is not None:
        bounds = index_input_bounds(module)
        for index, name in enumerate(module.inputs):
            if name not in inputs:
                inputs[name] = random_input(module.tensors[name], seed, index,
                                            bounds.get(name, RANDOM_INT_HIGH))
    return inputs


def _input_expect(module: Module, names: Mapping[str, str], hint: str,
                  where: str | None = None) -> Callable:
    """A header check for input arrays: `names` maps an archive member (or flag name) to
    the module input it gives."""
    def expect(member: str, shape: tuple[int, ...], dtype: np.dtype, at: str) -> None:
        name = names[member]
        tensor = module.tensors[name]
        check_header(shape, dtype, tensor, where or at,
                     hint.format(dtype=tensor.dtype, shape=list(tensor.shape)))
    return expect


def given_shapes(module: Module, flags: Iterable[str] = (), npz: str | None = None
                 ) -> dict[str, tuple[int, ...]]:
    """The shapes of the inputs given as arrays (`--inputs`, `--input NAME=@FILE.npy`), from
    their headers: what binds a symbolic module's dimensions (`tilekit.ir.dims.bind`). An
    input given as literal values has no shape of its own and binds nothing."""
    from tilekit.runtime.arrays import npy_shape, npz_shapes

    shapes: dict[str, tuple[int, ...]] = {}
    if npz is not None and not os.path.isdir(npz):
        where = f"--inputs {npz}"
        members = npz_members(npz, where)
        names = {m: input_name(module, m, where) for m in members}
        for member, shape in npz_shapes(npz, where, list(members)).items():
            shapes[names[member]] = shape
    for text in flags:
        name, value = parse_input_flag(text)
        where = f"--input {name}"
        name = input_name(module, name, where)
        if value.startswith("@") and not os.path.isdir(value[1:]):
            shapes[name] = npy_shape(value[1:], where)
    return shapes


def index_input_bounds(module: Module) -> dict[str, int]:
    """{input: n} for integer inputs that opaque ops read as indices: random values for them
    stay in [0, n), the smallest extent they index."""
    from tilekit import opaque

    bounds: dict[str, int] = {}
    for op in module.ops:
        if op.kind != "opaque" or not op.opaque:
            continue
        ins = list(op.opaque.get("inputs") or ())
        specs = [(module.tensors[n].shape, module.tensors[n].dtype) if n else None for n in ins]
        for position, n in opaque.index_bounds(op.opaque["type"], specs,
                                               op.opaque.get("attrs") or {}).items():
            name = ins[position]
            if name in module.inputs:
                bounds[name] = min(bounds.get(name, n), n)
    return bounds


def input_files(flags: Iterable[str] = (), npz: str | None = None) -> list[str]:
    """The files a run reads its inputs from (`--inputs`, every `--input NAME=@FILE`): what
    `-o` must never overwrite."""
    paths = [npz] if npz is not None else []
    for text in flags:
        _, sep, value = text.partition("=")
        if sep and value.strip().startswith("@"):
            paths.append(value.strip()[1:])
    return paths


def input_name(module: Module, name: str, where: str) -> str:
    """The IR name of an input given by its IR name or by its source-model (ONNX) name."""
    if name in module.inputs:
        return name
    renamed = {onnx: ir for ir, onnx in ((module.source or {}).get("inputs") or {}).items()}
    if renamed.get(name) in module.inputs:
        return renamed[name]
    raise TilekitError(f"unknown input '{name}'", where,
                       f"the module's inputs are: {_first(module.inputs, 20)}")


#: Random integers are drawn from [0, RANDOM_INT_HIGH) unless the input indexes a smaller
#: extent (`index_input_bounds`).
RANDOM_INT_HIGH = 8


def random_input(tensor: Tensor, seed: int, index: int, high: int = RANDOM_INT_HIGH
                 ) -> np.ndarray:
    """Deterministic random values for input number `index`.

    Each input draws from its own stream (`seed`, `index`), so giving one input explicitly
    does not change the values of the others. Floats: standard normal; integers: uniform in
    [0, min(high, 8)) (small and non-negative; `high` is the extent an index input indexes);
    bools: fair coin.
    """
    rng = np.random.default_rng([seed, index])
    dtype = numpy_dtype(tensor.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=tensor.shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, max(1, min(high, RANDOM_INT_HIGH)),
                            size=tensor.shape).astype(dtype)
    return rng.standard_normal(size=tensor.shape, dtype=np.float32).astype(dtype, copy=False)


def check_inputs(module: Module, inputs: Mapping[str, np.ndarray], *,
                 allow_nan: bool = False, seed_given: bool = False) -> None:
    """Every module input present with its declared shape and dtype, finite unless allowed."""
    for name in inputs:
        if name not in module.inputs:
            raise TilekitError(f"unknown input '{name}'", f"input '{name}'",
                               f"the module's inputs are: {_first(module.inputs, 20)}")
    missing = [name for name in module.inputs if name not in inputs]
    if missing:
        hint = "pass --input NAME=@file.npy, --inputs FILE.npz, or --seed N for random values"
        types = ", ".join(describe_tensor(module.tensors[n]) for n in missing[:5])
        raise TilekitError(f"no value for input(s) {_first(missing)} ({types})", "inputs",
                           hint if not seed_given else None)
    for name in module.inputs:
        array = inputs[name]
        tensor = module.tensors[name]
        check_array(array, tensor, f"input '{name}'",
                    f"convert it first, e.g. numpy.asarray(x, dtype='{tensor.dtype}')"
                    f".reshape({list(tensor.shape)})")
        if not allow_nan and array.dtype.kind not in "biu":
            finite = np.isfinite(array)
            if not finite.all():
                bad = int(finite.size - np.count_nonzero(finite))
                raise TilekitError(f"{bad} NaN or infinite value(s)", f"input '{name}'",
                                   "pass --allow-nan if that is intended")


# -- outputs -----------------------------------------------------------------------------

def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An `.npz` archive of `arrays`, byte-identical for identical arrays.

    `numpy.savez` stamps each member with the current time; here members are written in the
    given order with a fixed timestamp, uncompressed, readable by `numpy.load`.
    """
    buffer = io.BytesIO()
    write_npz(buffer, arrays)
    return buffer.getvalue()
