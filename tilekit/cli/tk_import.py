"""tk-import: an ONNX model becomes a tile-IR document and a weights sidecar.

    tk-import MODEL.onnx [-o OUT] [--weights FILE] [--format yaml|json] [--shape NAME=D0,D1,..]

The IR goes to stdout (or `-o OUT`); the weights go to `<OUT stem>.weights.npz` beside OUT, or
`<model stem>.weights.npz` in the current directory when the IR goes to stdout (`--weights`
overrides). Paths in the IR are relative to the IR's folder (the current directory for
stdout). See docs/import.md.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import click

from tilekit.cli.common import format_option, output_option, same_file, tk_command, warn
from tilekit.errors import TilekitError

TOOL = "tk-import"


def parse_shapes(flags: tuple[str, ...]) -> dict[str, list[int]]:
    """`--shape NAME=1,3,224,224` flags as {name: dims}."""
    shapes: dict[str, list[int]] = {}
    for flag in flags:
        name, eq, dims = flag.rpartition("=")
        try:
            values = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            values = []
        if not eq or not name or not values or any(v <= 0 for v in values):
            raise TilekitError(f"cannot read '{flag}'", "--shape",
                               "write NAME=D0,D1,... with positive sizes, e.g. "
                               "--shape input=1,3,224,224")
        shapes[name] = values
    return shapes


def default_weights_path(output: str, model_path: str | None) -> str:
    """`<OUT stem>.weights.npz` beside OUT; `<model stem>.weights.npz` in the current
    directory when the IR goes to stdout."""
    if output != "-":
        out = Path(output)
        return str(out.with_name(f"{out.stem}.weights.npz"))
    stem = Path(model_path).stem if model_path else "model"
    return f"{stem}.weights.npz"


def check_output_paths(output: str, weights_path: str, model_path: str | None) -> None:
    """Refuse, before anything is written, an IR output or weights path that cannot work:
    a missing folder, a directory, the input model, or the two outputs on one file."""
    if output != "-":
        where = f"-o {output}"
        target = Path(output)
        if target.is_dir():
            raise TilekitError("is a directory", where, "give a file name")
        folder = target.parent if str(target.parent) else Path(".")
        if not folder.is_dir():
            raise TilekitError(f"folder '{folder}' does not exist", where, "create it first")
        if model_path and same_file(model_path, output):
            raise TilekitError(f"refusing to overwrite the input file {model_path}", where,
                               "write to a different file")
    for other, what in ((output, "the IR output"), (model_path, "the model")):
        if other and same_file(other, weights_path):
            raise TilekitError(f"the weights file would overwrite {what}",
                               f"--weights {weights_path}", "choose another file name")


@tk_command(TOOL)
@click.argument("model", default="-", metavar="MODEL.onnx", required=False)
@output_option
@format_option
@click.option("--weights", "weights_path", default=None, metavar="FILE",
              help="Write the weights sidecar here (default: <OUT stem>.weights.npz beside "
                   "OUT, or <model stem>.weights.npz in the current directory for stdout).")
@click.option("--shape", "shape_flags", multiple=True, metavar="NAME=D0,D1,...",
              help="Static shape for a graph input (repeatable); needed when the model has "
                   "symbolic dimensions such as a batch size.")
@click.option("--list-ops", is_flag=True, help="Print the supported ONNX op types and exit.")
def main(model, output, fmt, weights_path, shape_flags, list_ops, quiet, debug):
    """Import the ONNX model MODEL.onnx (a file, or '-'/nothing for stdin) as tile IR."""
    from tilekit.ir.codec import write_module
    from tilekit.onnx import attach_files, import_model, load_model, load_model_bytes
    from tilekit.onnx.converters import CONVERTERS, supported_op_types

    if list_ops:
        for op_type in supported_op_types():
            click.echo(f"{op_type:<28} {CONVERTERS[op_type].summary}")
        return 0
    shapes = parse_shapes(shape_flags)
    if model == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise TilekitError("no model given and stdin is a terminal", "<stdin>",
                               "pass a file: tk-import model.onnx")
        data = sys.stdin.buffer.read()
        proto = load_model_bytes(data, "<stdin>")
        model_path, name = None, proto.graph.name or "model"
    else:
        proto = load_model(model)
        data = Path(model).read_bytes()
        model_path, name = model, Path(model).stem
    weights_path = weights_path or default_weights_path(output, model_path)
    check_output_paths(output, weights_path, model_path)
    try:
        imported = import_model(proto, name=name, shapes=shapes)
    except TilekitError as exc:
        shown = model_path or "<stdin>"
        where = f"{shown}: {exc.where}" if exc.where else shown
        raise type(exc)(exc.what, where, exc.hint) from None
    if not quiet:
        for message in imported.warnings:
            warn(TOOL, message)
    ir_folder = os.getcwd() if output == "-" else os.path.dirname(os.path.abspath(output))
    options = {"opset": _opset(proto)}
    if shapes:
        options["shapes"] = {k: v for k, v in sorted(shapes.items())}
    imported = attach_files(imported, ir_folder=ir_folder, weights_path=weights_path,
                            onnx_path=model_path, onnx_sha256=hashlib.sha256(data).hexdigest(),
                            options=options)
    write_module(imported.module, output, fmt or "yaml", input_path=model_path)
    return 0


def _opset(proto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
