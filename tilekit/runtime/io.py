"""Arrays in and out of a run: weights, inputs and outputs, and the checks on each.

Everything here raises `TilekitError` (exit 2) with the flag or file at fault and a hint:
a run never starts on data that does not match the module.

- weights: the sidecar `.npz` named by `module.weights`, checksum verified before it is read,
  every weight tensor present with its declared shape and dtype;
- inputs: `--input NAME=@file.npy`, `--input NAME=1,2,3`, `--inputs file.npz`, or random with
  `--seed`; names, shapes, dtypes and finiteness checked against the module;
- outputs: a deterministic `.npz` (fixed member order and timestamps) written atomically.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.model import Module, Tensor

# -- dtypes ------------------------------------------------------------------------------

_SIMPLE_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8",
                  "bool")


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an IR dtype name (bfloat16 through ml_dtypes, which onnx installs)."""
    if name in _SIMPLE_DTYPES:
        return np.dtype(name)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
            raise UnsupportedError("dtype bfloat16 needs the ml_dtypes package", None,
                                   "pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    raise UnsupportedError(f"dtype '{name}' has no NumPy equivalent", None,
                           f"known dtypes: {', '.join(_SIMPLE_DTYPES + ('bfloat16',))}")


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


def resolve_sidecar(ref: Mapping, key: str, folder: Path, where: str) -> Path:
    """The path of a file referenced as `{key: relative path, sha256: hex}`, checksum verified.

    `where` names the IR field (`weights`, `source`) in messages.
    """
    rel = ref.get(key) if isinstance(ref, Mapping) else None
    if not isinstance(rel, str) or not rel:
        raise TilekitError(f"has no '{key}' path", where,
                           f"expected {{{key}: relative/path, sha256: hex}}")
    path = (folder / rel) if not os.path.isabs(rel) else Path(rel)
    if not path.is_file():
        raise TilekitError(f"file '{rel}' not found (looked in {folder})", f"{where}.{key}",
                           "paths in the IR are relative to the IR file's folder, or to the "
                           "current directory when the IR comes through stdin")
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


_NPY_MAGIC = b"\x93NUMPY"


def _load_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    # Look at the file before np.load does: it returns an ndarray for an .npy file and reads
    # anything else as a pickle, whose refusal ("contains pickled data") would mislead.
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise TilekitError(f"cannot read '{path}': {exc.strerror}", where) from None
    if magic.startswith(_NPY_MAGIC):
        raise TilekitError(f"'{path}' is an .npy file (one array), not an .npz archive", where,
                           "pass it as --input NAME=@FILE.npy, or bundle arrays with "
                           "numpy.savez")
    if not zipfile.is_zipfile(path):
        raise TilekitError(f"'{path}' is not an .npz archive", where,
                           "expected an archive written by numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise TilekitError(f"cannot read '{path}' as .npz: {exc}", where,
                           "expected an archive written by numpy.savez") from None


def _load_npy(path: Path, where: str) -> np.ndarray:
    if path.is_dir():
        raise TilekitError(f"'{path}' is a directory, not an .npy file", where,
                           "expected NAME=@FILE.npy")
    if not path.is_file():
        raise TilekitError(f"file '{path}' not found", where, "check the path")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise TilekitError(f"cannot read '{path}' as .npy: {exc}", where,
                           "expected one array written by numpy.save") from None
    if not isinstance(array, np.ndarray):
        raise TilekitError(f"'{path}' holds several arrays, not one", where,
                           "use --inputs FILE.npz for an archive")
    return array


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
    arrays = _load_npz(path, f"weights.file ({path.name})")
    weights: dict[str, np.ndarray] = {}
    for name in names:
        where = f"weights: tensor '{name}'"
        if name not in arrays:
            raise TilekitError(f"missing from '{path.name}'", where,
                               "the sidecar does not match the IR: re-run tk-import")
        array = arrays.pop(name)
        check_array(array, module.tensors[name], where, "the sidecar does not match the IR: "
                    "re-run tk-import")
        weights[name] = array
    return weights


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
            values = [int(v) for v in items]
        else:
            values = [float(v) for v in items]
    except (KeyError, ValueError):
        kind = "bool" if dtype == np.bool_ else ("integer" if dtype.kind in "iu" else "number")
        raise TilekitError(f"cannot read '{value}' as {kind}s for {describe_tensor(tensor)}",
                           where, "expected comma-separated values, or NAME=@file.npy") from None
    if len(values) == 1:
        return np.full(tensor.shape, values[0], dtype=dtype)
    if len(values) != tensor.size:
        raise TilekitError(f"{len(values)} values given, {describe_tensor(tensor)} needs "
                           f"{tensor.size} (or one value to fill it)", where,
                           "use NAME=@file.npy for larger inputs")
    try:
        array = np.array(values).astype(dtype)
    except OverflowError:
        raise TilekitError(f"a value does not fit {tensor.dtype}", where) from None
    return array.reshape(tensor.shape)


def gather_inputs(module: Module, flags: Iterable[str] = (), npz: str | None = None,
                  seed: int | None = None) -> dict[str, np.ndarray]:
    """Assemble the inputs of one run from the tk-run flags (not yet checked: see
    `check_inputs`).

    `npz` values come first, then `--input` flags override them by name; with `seed`, inputs
    that are still missing get random values (`random_input`).
    """
    inputs: dict[str, np.ndarray] = {}
    if npz is not None:
        path = Path(npz)
        if path.is_dir():
            raise TilekitError(f"'{npz}' is a directory, not an .npz archive", "--inputs",
                               "expected --inputs FILE.npz")
        if not path.is_file():
            raise TilekitError(f"file '{npz}' not found", "--inputs", "check the path")
        for name, array in _load_npz(path, f"--inputs {npz}").items():
            inputs[input_name(module, name, f"--inputs {npz}")] = array
    given_by_flag: set[str] = set()
    for text in flags:
        name, value = parse_input_flag(text)
        where = f"--input {name}"
        name = input_name(module, name, where)
        if name in given_by_flag:
            raise TilekitError("given twice", where, "pass each input once")
        given_by_flag.add(name)
        if value.startswith("@"):
            inputs[name] = _load_npy(Path(value[1:]), where)
        else:
            inputs[name] = _parse_literal(value, module.tensors[name], where)
    if seed is not None:
        for index, name in enumerate(module.inputs):
            if name not in inputs:
                inputs[name] = random_input(module.tensors[name], seed, index)
    return inputs


def input_files(flags: Iterable[str] = (), npz: str | None = None) -> list[str]:
    """The files a run reads its inputs from (`--inputs`, every `--input NAME=@FILE`): what
    `-o` must never overwrite."""
    paths = [npz] if npz is not None else []
    for text in flags:
        _, sep, value = text.partition("=")
        if sep and value.strip().startswith("@"):
            paths.append(value.strip()[1:])
    return paths


def weights_file(module: Module, folder: Path) -> Path | None:
    """The path of the module's weights sidecar (unchecked), if it names one."""
    rel = module.weights.get("file") if isinstance(module.weights, Mapping) else None
    if not isinstance(rel, str) or not rel:
        return None
    return Path(rel) if os.path.isabs(rel) else folder / rel


def input_name(module: Module, name: str, where: str) -> str:
    """The IR name of an input given by its IR name or by its source-model (ONNX) name."""
    if name in module.inputs:
        return name
    renamed = {onnx: ir for ir, onnx in ((module.source or {}).get("inputs") or {}).items()}
    if renamed.get(name) in module.inputs:
        return renamed[name]
    raise TilekitError(f"unknown input '{name}'", where,
                       f"the module's inputs are: {_first(module.inputs, 20)}")


def random_input(tensor: Tensor, seed: int, index: int) -> np.ndarray:
    """Deterministic random values for input number `index`.

    Each input draws from its own stream (`seed`, `index`), so giving one input explicitly
    does not change the values of the others. Floats: standard normal; integers: uniform in
    [0, 8) (small and non-negative, safe as indices into any axis of size 8 or more);
    bools: fair coin.
    """
    rng = np.random.default_rng([seed, index])
    dtype = numpy_dtype(tensor.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=tensor.shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 8, size=tensor.shape).astype(dtype)
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
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()
