"""tk-import: an ONNX model becomes a tile-IR document and a weights sidecar.

    tk-import MODEL.onnx [-o OUT] [--weights FILE] [--format yaml|json] [--shape NAME=D0,D1,..]
              [--dim NAME=MIN..MAX[:LIKELY,..] | --dim NAME=SIZE] [--value NAME=V0,V1,..]
              [--random-weights SEED] [--dtype float16|bf16|...] [--max-trips N]

An input dimension the model leaves open (a batch, a sequence) becomes a symbol of the
module's `dims` (range `1..4096` unless `--dim` gives one; `--dim NAME=SIZE` imports one size).

The IR goes to stdout (or `-o OUT`); the weights go to `<OUT stem>.weights.npz` beside OUT, or
`<model stem>.weights.npz` in the current directory when the IR goes to stdout (`--weights`
overrides); a default name that holds other weights is never replaced (another IR may name
it): the weights then go to `<stem>.<sha256[:12]>.weights.npz` (`unshared_weights_path`).
Paths in the IR are relative to the IR's folder (the current directory for stdout). See
docs/import.md.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import click

from tilekit import limits
from tilekit.cli.common import format_option, output_option, same_file, tk_command, warn
from tilekit.errors import TilekitError, excerpt
from tilekit.fileio import read_bytes

TOOL = "tk-import"


def parse_shapes(flags: tuple[str, ...]) -> dict[str, list[int]]:
    """`--shape NAME=1,3,224,224` flags as {name: dims} (each within the tensor budget)."""
    shapes: dict[str, list[int]] = {}
    for flag in flags:
        name, eq, dims = flag.rpartition("=")
        try:
            values = [int(d) for d in dims.replace("x", ",").split(",")
                      if d.strip() and len(d.strip()) <= 20]
        except ValueError:
            values = []
        if not eq or not name or not values or any(v <= 0 for v in values):
            raise TilekitError(f"cannot read '{excerpt(flag, 60, quote=False)}'", "--shape",
                               "write NAME=D0,D1,... with positive sizes, e.g. "
                               "--shape input=1,3,224,224")
        limits.elements(values, "--shape", f"the shape of '{excerpt(name, quote=False)}'")
        shapes[name] = values
    return shapes


def parse_dims(flags: tuple[str, ...]) -> dict:
    """`--dim NAME=MIN..MAX[:L,..]` / `--dim NAME=SIZE` flags by symbol, each named once."""
    from tilekit.onnx.symbolic import parse_dim_flag

    dims = {}
    for flag in flags:
        name, parsed = parse_dim_flag(flag)
        if name in dims:
            raise TilekitError(f"--dim names '{excerpt(name, 40, quote=False)}' twice",
                               "--dim", "give each symbol once")
        dims[name] = parsed
    return dims


#: The most values one `--value` may give ("a scalar or a small list").
MAX_VALUES = 4096


def parse_values(flags: tuple[str, ...]) -> dict[str, list[int | float]]:
    """`--value NAME=V0,V1,...` flags as {name: numbers} (ints where written as whole
    numbers), each input named once."""
    values: dict[str, list[int | float]] = {}
    for flag in flags:
        name, eq, text = flag.partition("=")
        name = name.strip()
        numbers: list[int | float] = []
        try:
            items = [t.strip() for t in text.split(",")]
            if len(items) > MAX_VALUES or any(len(t) > 40 for t in items):
                raise ValueError
            for t in items:
                number = float(t)
                numbers.append(int(number) if number.is_integer() and "." not in t
                               and "e" not in t.lower() and abs(number) < 2 ** 63 else number)
        except ValueError:
            numbers = []
        if not eq or not name or not numbers:
            raise TilekitError(f"cannot read '{excerpt(flag, 60, quote=False)}'", "--value",
                               "write NAME=V or NAME=V0,V1,... with at most "
                               f"{MAX_VALUES} numbers, e.g. --value sr=16000")
        if name in values:
            raise TilekitError(f"'{excerpt(name, quote=False)}' is given twice", "--value",
                               "fix each input once")
        values[name] = numbers
    return values


def default_weights_path(output: str, model_path: str | None) -> str:
    """`<OUT stem>.weights.npz` beside OUT; `<model stem>.weights.npz` in the current
    directory when the IR goes to stdout."""
    if output != "-":
        out = Path(output)
        if not out.name or os.path.isdir(output):
            raise TilekitError(f"'{output}' is a directory", f"-o {output}",
                               "give a file name, e.g. -o model.tk.yaml")
        return str(out.with_name(f"{out.stem}.weights.npz"))
    stem = Path(model_path).stem if model_path else "model"
    return f"{stem}.weights.npz"


def unshared_weights_path(weights_path: str, digest: str) -> str:
    """Where default-named weights with sha256 `digest` go: the default name, unless a regular
    file there holds other weights. Another IR may name that file (an import with another
    --dtype, the stages rolled from an earlier import), and replacing it would break that IR
    with a checksum mismatch; then the name carries the first 12 hex digits of the new
    weights' sha256 (`m.weights.npz` -> `m.3fa9c2d17b0e.weights.npz`). Two IRs share a
    sidecar only when its bytes are theirs."""
    from tilekit.runtime.io import sha256_file

    try:
        st = os.stat(weights_path)
    except OSError:
        return weights_path
    if not stat.S_ISREG(st.st_mode) or sha256_file(Path(weights_path)) == digest:
        return weights_path
    name = Path(weights_path).name
    stem = name[:-len(".weights.npz")] if name.endswith(".weights.npz") else Path(name).stem
    return str(Path(weights_path).with_name(f"{stem}.{digest[:12]}.weights.npz"))


def check_output_paths(out, output: str, weights_path: str, follow_links: bool = True) -> None:
    """Refuse, before anything is written, an IR output or weights path that cannot work
    (a missing folder, a directory, an input of the command, both on one file; a symlink
    where tk-import chose the weights file's name itself)."""
    out.check(output, f"-o {output}" if output != "-" else "-o")
    if output != "-" and same_file(output, weights_path):
        raise TilekitError("the weights file would overwrite the IR output",
                           f"--weights {weights_path}", "choose another file name")
    out.check(weights_path, f"--weights {weights_path}", follow_links)


@tk_command(TOOL)
@click.argument("model", default="-", metavar="MODEL.onnx", required=False)
@output_option
@format_option
@click.option("--weights", "weights_path", default=None, metavar="FILE",
              help="Write the weights sidecar here (default: <OUT stem>.weights.npz beside "
                   "OUT, or <model stem>.weights.npz in the current directory for stdout).")
@click.option("--shape", "shape_flags", multiple=True, metavar="NAME=D0,D1,...",
              help="Static shape for a graph input (repeatable): its open dimensions get "
                   "these sizes instead of staying symbolic.")
@click.option("--dim", "dim_flags", multiple=True, metavar="NAME=MIN..MAX[:L,..]",
              help="A symbolic dimension's range and likely values (repeatable; NAME is the "
                   "model's dim_param, or INPUT_AXIS for an unnamed one; default range "
                   "1..4096), or NAME=SIZE to import that one size.")
@click.option("--lenient-shapes", "lenient", is_flag=True,
              help="Import a model that ONNX's strict shape inference refuses, with lenient "
                   "inference (trusting its declared shapes); without it such a model is "
                   "refused as malformed.")
@click.option("--value", "value_flags", multiple=True, metavar="NAME=V0,V1,...",
              help="Fix a graph input to a constant (repeatable): a scalar or a small "
                   "comma-separated list, in the input's declared type and shape. It stops "
                   "being an input and what depends on it folds, e.g. an If on a sample "
                   "rate: --value sr=16000.")
@click.option("--random-weights", "random_weights", type=click.IntRange(min=0), default=None,
              metavar="SEED", help="Replace the model's float weights with seeded random "
                                   "values (normal / sqrt(fan_in); positive where a variance "
                                   "or divisor needs it), so that --check compares real "
                                   "arithmetic; tk-run --check runs the source model with the "
                                   "same values. Integer tensors are untouched.")
@click.option("--dtype", default="float32", show_default=True, metavar="DTYPE",
              help="Store the model's float32 tensors and weights as float16 or bfloat16 "
                   "(also fp16, bf16, fp32, half; arithmetic stays float32, rounded once on "
                   "store; docs/import.md).")
@click.option("--max-trips", "max_trips", type=click.IntRange(min=1), default=None,
              metavar="N", help="Bound the scan outputs of loops whose trip count is known "
                                "only at run time (they get N rows and a run-time count).")
@click.option("--list-ops", is_flag=True, help="Print the supported ONNX op types and exit.")
def main(model, output, fmt, weights_path, shape_flags, dim_flags, lenient, value_flags,
         random_weights, dtype, max_trips, list_ops, quiet, debug):
    """Import the ONNX model MODEL.onnx (a file, or '-'/nothing for stdin) as tile IR."""
    from tilekit.ir.codec import write_module
    from tilekit.onnx import attach_files, import_model, load_model_bytes
    from tilekit.onnx.converters import CONVERTERS, supported_op_types
    from tilekit.onnx.names import sanitize
    from tilekit.outputs import OutputSet

    if list_ops:
        for op_type in supported_op_types():
            click.echo(f"{op_type:<28} {CONVERTERS[op_type].summary}")
        return 0
    from tilekit.onnx.precision import canonical_dtype, import_options, to_precision

    dtype = canonical_dtype(dtype)
    shapes = parse_shapes(shape_flags)
    dims = parse_dims(dim_flags)
    values = parse_values(value_flags)
    data, shown = read_bytes(model, limits.MODEL_BYTES, "ONNX model", form="protobuf")
    model_path = None if model == "-" else model
    proto = load_model_bytes(data, shown,
                             folder=None if model_path is None else str(Path(model).parent))
    name = sanitize(Path(model).stem if model_path else (proto.graph.name or "model"), "model")
    named_weights = weights_path is not None  # a default name is never followed as a link
    weights_path = weights_path or default_weights_path(output, model_path)
    # The weights and the IR become visible together or not at all (tilekit.outputs).
    with OutputSet() as out:
        check_output_paths(out, output, weights_path, named_weights)
        try:
            imported = to_precision(import_model(proto, name=name, shapes=shapes,
                                                 lenient=lenient, max_trips=max_trips,
                                                 values=values, dims=dims,
                                                 random_weights=random_weights),
                                    dtype)
        except TilekitError as exc:
            where = f"{shown}: {exc.where}" if exc.where else shown
            raise type(exc)(exc.what, where, exc.hint) from None
        if not quiet:
            for message in imported.warnings:
                warn(TOOL, message)
        ir_folder = os.getcwd() if output == "-" else os.path.dirname(os.path.abspath(output))
        options = {"opset": _opset(proto)}
        if shapes:
            options["shapes"] = {k: v for k, v in sorted(shapes.items())}
        static = {k: f.value for k, f in sorted(dims.items()) if f.value is not None}
        if static:
            options["dims"] = static
        if values:
            options["values"] = {k: v for k, v in sorted(values.items())}
        if random_weights is not None:
            options["random_weights"] = random_weights
        if lenient:
            options["lenient_shapes"] = True
        options.update(import_options(dtype))
        if max_trips is not None:
            options["max_trips"] = max_trips
        imported = attach_files(imported, ir_folder=ir_folder, weights_path=weights_path,
                                onnx_path=model_path,
                                onnx_sha256=hashlib.sha256(data).hexdigest(),
                                options=options, outputs=out, follow_links=named_weights)
        moved = None
        if not named_weights and imported.module.weights:
            imported, moved = _keep_sidecars_apart(out, imported, weights_path)
        write_module(imported.module, output, fmt or "yaml", outputs=out)
        out.commit()
    if moved and not quiet:
        warn(TOOL, f"{weights_path} holds other weights (another IR may name it): the weights "
                   f"went to {moved}; pass --weights FILE to choose the file")
    return 0


def _keep_sidecars_apart(out, imported, weights_path: str):
    """(the import, None), or with its default-named sidecar staged under
    `unshared_weights_path` instead: (the import naming it, that path)."""
    from dataclasses import replace
    from pathlib import PurePosixPath

    ref = imported.module.weights
    chosen = unshared_weights_path(weights_path, ref["sha256"])
    if chosen == weights_path:
        return imported, None
    out.retarget(weights_path, chosen, f"--weights {chosen}", follow_links=False)
    file = str(PurePosixPath(ref["file"]).with_name(Path(chosen).name))
    module = replace(imported.module, weights={**ref, "file": file})
    return replace(imported, module=module), chosen


def _opset(proto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
