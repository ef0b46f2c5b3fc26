"""Export the model corpus of tests/data/corpus/: small real architectures as ONNX files.

Every model is a real architecture (Hugging Face transformers' GPT-2, BERT, Llama, Mistral,
Qwen2, Mixtral, T5 encoder, Whisper encoder, Wav2Vec2, ViT, Swin; torchvision's ResNet, MobileNetV3,
EfficientNet, RegNet, ConvNeXt, DenseNet) in a tiny configuration (2 layers, hidden 32-64,
vocabulary <= 1000, images of 32x32 or 64x64, reduced widths through the constructors'
own arguments), with random weights (each model's own initialisation after
`torch.manual_seed(0)`), exported twice:

- `ts17`: `torch.onnx.export(..., dynamo=False, opset_version=17)` (the TorchScript exporter);
- `dynamo18`: `torch.onnx.export(..., dynamo=True, opset_version=18)` (the torch.export /
  onnxscript exporter).

All with static shapes; GPT-2, BERT, Llama, the T5 encoder and ResNet also with a dynamic
batch (and sequence) dimension (`<model>.<exporter>.dynamic.onnx`: imported with symbolic
dimensions, or for one size with `tk-import --shape`). What was made, each
file's inputs and what failed (with the exporter's message) go to `manifest.json` beside the
models, which tests/corpus/test_corpus.py reads.

torch is a tool for making the files, not a dependency of tilekit or its tests. Run it in a
separate environment (made here with Python 3.11):

    python3 -m venv /tmp/exportenv
    /tmp/exportenv/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 \\
        onnx==1.23.2 onnxscript==0.7.2
    /tmp/exportenv/bin/python tests/models/export_corpus.py            # all models
    /tmp/exportenv/bin/python tests/models/export_corpus.py gpt2 resnet  # some

The corpus in the repository was made with exactly those versions (recorded in the
manifest). Deterministic: seeds fixed, one thread, the same versions give the same files.

With these versions both exporters succeed on every model (`failures` in the manifest is
empty). What it took:
- the decoders (GPT-2, Llama, Mistral, Qwen2) are given the attention mask: without one,
  transformers 5 looks for packed sequences with `torch.diff`, and the TorchScript exporter
  fails with "Exporting the operator 'aten::diff' to ONNX opset version 17 is not supported";
- every model is wrapped in a module whose forward takes one positional parameter per input
  (passing GPT-2's mask second by position would make it `past_key_values`, and
  torch.export matches `dynamic_shapes` to forward's own parameters, not to `*args`);
- Whisper's special token ids are set inside the small vocabulary (its defaults, 50256 and
  up, fail "Padding_idx must be within num_embeddings").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

OUT = Path(__file__).resolve().parents[1] / "data" / "corpus"
SEED = 0
#: What the corpus may cost in the repository (each file, all together).
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 8 << 20


# -- the models --------------------------------------------------------------------------

class Spec:
    """One model: a builder (-> torch module in eval mode), its example inputs, and which
    dims of which inputs are dynamic in the `.dynamic` variant (None: no such variant)."""

    def __init__(self, name: str, build: Callable[[], Any], inputs: Callable[[], dict],
                 dynamic: dict[str, dict[int, str]] | None = None, family: str = "",
                 outputs: tuple[str, ...] = ("output",)):
        self.name, self.build, self.inputs = name, build, inputs
        self.dynamic, self.family, self.outputs = dynamic, family, outputs


def _ids(vocab: int, batch: int = 1, seq: int = 16):
    import torch
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def _image(size: int, channels: int = 3):
    import torch
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(1, channels, size, size, generator=g)


class _LogitsOnly:
    """Wraps a transformers model so that forward takes its inputs by position (with the
    names the model gives them) and returns one tensor (no cache, no dict)."""

    @staticmethod
    def wrap(model, field: str, names: tuple[str, ...] = ("input_ids",)):
        import torch

        extra = {"use_cache": False} if "use_cache" in _forward_params(model) else {}

        def call(*args):
            out = model(**dict(zip(names, args)), return_dict=True, **extra)
            return getattr(out, field)

        # torch.export matches dynamic shapes to forward's own parameters: one per input.
        if len(names) == 1:
            class Wrapped(torch.nn.Module):
                def forward(self, a):
                    return call(a)
        else:
            class Wrapped(torch.nn.Module):
                def forward(self, a, b):
                    return call(a, b)
        wrapped = Wrapped()
        wrapped.model = model
        return wrapped.eval()


def _forward_params(model) -> set[str]:
    import inspect
    return set(inspect.signature(model.forward).parameters)


def _hf(config_cls: str, model_cls: str, field: str, names=("input_ids",), **config):
    def build():
        import transformers
        cfg = getattr(transformers, config_cls)(**config)
        # The eager attention: what every exporter handles and what real exports of
        # these architectures mostly contain (sdpa is decomposed into the same ops).
        cfg._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(cfg).eval()
        return _LogitsOnly.wrap(model, field, names)
    return build


MASKED = ("input_ids", "attention_mask")
LM = dict(names=MASKED, vocab_size=512, num_hidden_layers=2, hidden_size=32, intermediate_size=64,
          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _whisper_encoder():
    import transformers
    cfg = transformers.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                                     max_source_positions=32, max_target_positions=16,
                                     vocab_size=100, pad_token_id=1, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=1)
    cfg._attn_implementation = "eager"
    encoder = transformers.WhisperModel(cfg).get_encoder().eval()
    return _LogitsOnly.wrap(encoder, "last_hidden_state", ("input_features",))


def _wav2vec2():
    """Wav2Vec2's convolutional feature extractor (group-normalised first layer), feature
    projection, convolutional position embedding (grouped, weight-normed) and encoder."""
    import transformers
    cfg = transformers.Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, conv_dim=(8, 8, 8),
                                      conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                                      num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
                                      vocab_size=16)
    cfg._attn_implementation = "eager"
    return _LogitsOnly.wrap(transformers.Wav2Vec2Model(cfg).eval(), "last_hidden_state",
                            ("input_values",))


def _small_resnet():
    """torchvision's ResNet (its BasicBlock, _make_layer and forward) with widths 8..64 and
    one block per stage: the constructor fixes the widths at 64..512."""
    import torch
    from torchvision.models.resnet import BasicBlock, ResNet

    class SmallResNet(ResNet):
        def __init__(self, widths=(8, 16, 32, 64), num_classes=10):
            torch.nn.Module.__init__(self)
            self._norm_layer = torch.nn.BatchNorm2d
            self.inplanes, self.dilation, self.groups, self.base_width = widths[0], 1, 1, 64
            self.conv1 = torch.nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(widths[0])
            self.relu = torch.nn.ReLU(inplace=True)
            self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(BasicBlock, widths[0], 1)
            self.layer2 = self._make_layer(BasicBlock, widths[1], 1, stride=2)
            self.layer3 = self._make_layer(BasicBlock, widths[2], 1, stride=2)
            self.layer4 = self._make_layer(BasicBlock, widths[3], 1, stride=2)
            self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
            self.fc = torch.nn.Linear(widths[3], num_classes)

    return _randomize_norms(SmallResNet().eval())


def _mobilenet_v3():
    from torchvision.models import mobilenet_v3_small
    return _randomize_norms(mobilenet_v3_small(weights=None, width_mult=0.15,
                                               num_classes=10).eval())


def _efficientnet():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.15, depth_mult=0.25)
    return _randomize_norms(EfficientNet(setting, dropout=0.2, last_channel=last,
                                         num_classes=10).eval())


def _regnet():
    from torchvision.models.regnet import BlockParams, RegNet
    params = BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8)
    return _randomize_norms(RegNet(params, stem_width=8, num_classes=10).eval())


def _convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    blocks = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]
    return ConvNeXt(blocks, num_classes=10).eval()


def _densenet():
    from torchvision.models.densenet import DenseNet
    return _randomize_norms(DenseNet(growth_rate=8, block_config=(2, 2),
                                     num_init_features=16, bn_size=2,
                                     num_classes=10).eval())


def _randomize_norms(model):
    """BatchNorm statistics and affine parameters drawn at random (a fresh torchvision model
    has mean 0, var 1, scale 1, shift 0: folding them would test nothing)."""
    import torch
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return model


def _specs() -> list[Spec]:
    import torch

    def tokens(vocab: int, mask: bool = True):
        # Decoders take the attention mask too, as real exports do (without one,
        # transformers looks for packed sequences with aten::diff, which the TorchScript
        # exporter lacks).
        def make():
            feeds = {"input_ids": _ids(vocab)}
            if mask:
                feeds["attention_mask"] = torch.ones(1, 16, dtype=torch.int64)
            return feeds
        return make

    seq_dyn = {"input_ids": {0: "batch", 1: "sequence"},
               "attention_mask": {0: "batch", 1: "sequence"}}
    return [
        Spec("gpt2", _hf("GPT2Config", "GPT2LMHeadModel", "logits", names=MASKED, vocab_size=512,
                         bos_token_id=0, eos_token_id=0,
                         n_layer=2, n_embd=32, n_head=2, n_positions=64), tokens(512),
             dynamic=seq_dyn, family="transformers", outputs=("logits",)),
        Spec("bert", _hf("BertConfig", "BertModel", "last_hidden_state", names=MASKED,
                         vocab_size=1000,
                         hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64),
             tokens(1000), dynamic=seq_dyn, family="transformers",
             outputs=("last_hidden_state",)),
        Spec("llama", _hf("LlamaConfig", "LlamaForCausalLM", "logits", **LM), tokens(512),
             dynamic=seq_dyn, family="transformers", outputs=("logits",)),
        Spec("mistral", _hf("MistralConfig", "MistralForCausalLM", "logits", sliding_window=8,
                            **LM), tokens(512), family="transformers", outputs=("logits",)),
        Spec("qwen2", _hf("Qwen2Config", "Qwen2ForCausalLM", "logits", **LM), tokens(512),
             family="transformers", outputs=("logits",)),
        Spec("t5_encoder", _hf("T5Config", "T5EncoderModel", "last_hidden_state",
                               vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_heads=4, relative_attention_num_buckets=8),
             tokens(1000, mask=False), dynamic={"input_ids": {0: "batch", 1: "sequence"}},
             family="transformers", outputs=("last_hidden_state",)),
        Spec("whisper_encoder", _whisper_encoder,
             lambda: {"input_features": _image(64, 1)[0, :, :16, :]},
             family="transformers", outputs=("last_hidden_state",)),
        Spec("vit", _hf("ViTConfig", "ViTForImageClassification", "logits",
                        names=("pixel_values",), hidden_size=32,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        image_size=32, patch_size=8, num_labels=10),
             lambda: {"pixel_values": _image(32)}, family="transformers",
             outputs=("logits",)),
        Spec("swin", _hf("SwinConfig", "SwinForImageClassification", "logits",
                         names=("pixel_values",), image_size=32,
                         patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                         window_size=4, num_labels=10),
             lambda: {"pixel_values": _image(32)}, family="transformers",
             outputs=("logits",)),
        # Mixture of experts: the router's top-k and the experts as gathered batched matmuls
        # (transformers' default grouped_mm has no ONNX export; its eager loop needs
        # aten::histc, which the TorchScript exporter lacks).
        Spec("mixtral", _hf("MixtralConfig", "MixtralForCausalLM", "logits", names=MASKED,
                            vocab_size=64, num_hidden_layers=1, hidden_size=16,
                            intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=32, num_local_experts=4,
                            num_experts_per_tok=2, experts_implementation="batched_mm"),
             tokens(64), family="transformers", outputs=("logits",)),
        Spec("wav2vec2", _wav2vec2, lambda: {"input_values": _image(20, 1)[0, 0, :20, :20]
                                             .reshape(1, 400)},
             family="transformers", outputs=("last_hidden_state",)),
        Spec("resnet", _small_resnet, lambda: {"input": _image(64)},
             dynamic={"input": {0: "batch"}}, family="torchvision"),
        Spec("mobilenet_v3", _mobilenet_v3, lambda: {"input": _image(64)},
             family="torchvision"),
        Spec("efficientnet", _efficientnet, lambda: {"input": _image(64)},
             family="torchvision"),
        Spec("regnet", _regnet, lambda: {"input": _image(64)}, family="torchvision"),
        Spec("convnext", _convnext, lambda: {"input": _image(32)}, family="torchvision"),
        Spec("densenet", _densenet, lambda: {"input": _image(32)}, family="torchvision"),
    ]


# -- exporting ---------------------------------------------------------------------------

EXPORTERS = {"ts17": (False, 17), "dynamo18": (True, 18)}


def export(spec: Spec, exporter: str, dynamic: bool, path: Path) -> None:
    import torch

    dynamo, opset = EXPORTERS[exporter]
    torch.manual_seed(SEED)
    model = spec.build()
    inputs = spec.inputs()
    names = list(inputs)
    args = tuple(inputs.values())
    kwargs: dict[str, Any] = dict(input_names=names, output_names=list(spec.outputs),
                                  opset_version=opset, dynamo=dynamo)
    if dynamic:
        if dynamo:
            dims = {n: {d: torch.export.Dim.DYNAMIC for d in spec.dynamic.get(n, {})}
                    for n in names}
            kwargs["dynamic_shapes"] = tuple(dims[n] or None for n in names)
        else:
            kwargs["dynamic_axes"] = {n: spec.dynamic[n] for n in names if n in spec.dynamic}
    if dynamo:
        kwargs["external_data"] = False
    with torch.no_grad(), warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), **kwargs)
    _normalise(path)


@contextlib.contextmanager
def _quiet():
    """The exporters print progress on stdout; keep the script's output to its own lines."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _normalise(path: Path) -> None:
    """Drop what makes a file differ between runs or machines: producer doc strings that
    carry source paths, metadata of the exporting process."""
    import onnx

    model = onnx.load(str(path))
    model.doc_string = ""
    del model.metadata_props[:]
    stack = [model.graph]
    while stack:
        graph = stack.pop()
        graph.doc_string = ""
        for node in graph.node:
            node.doc_string = ""
            del node.metadata_props[:]
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            vi.doc_string = ""
            del vi.metadata_props[:]
        for init in graph.initializer:
            init.doc_string = ""
            del init.metadata_props[:]
    onnx.save(model, str(path))


def _summary(exc: BaseException) -> str:
    """One line saying why an export failed: torch.export's own exception summary when
    the exporter wraps one (`<class '...'>: message`), else the message's first line."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("<class '"):
            return ln.replace("<class '", "").replace("'>", "", 1)
    return lines[0] if lines else type(exc).__name__


def _input_record(path: Path) -> list[dict]:
    import onnx
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tt.shape.dim]
        out.append({"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
            tt.elem_type).name, "shape": dims})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument("--out", default=str(OUT), help="output folder")
    args = parser.parse_args(argv)

    import onnx
    import onnxscript
    import torch
    import torchvision
    import transformers

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest["versions"] = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                            "transformers": transformers.__version__,
                            "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                            "python": ".".join(map(str, sys.version_info[:3]))}
    manifest["seed"] = SEED
    models = manifest.setdefault("models", {})
    failures = manifest.setdefault("failures", {})
    specs = [s for s in _specs() if not args.models or s.name in args.models]
    for spec in specs:
        for exporter in EXPORTERS:
            for dynamic in ([False, True] if spec.dynamic else [False]):
                key = f"{spec.name}.{exporter}" + (".dynamic" if dynamic else "")
                path = out / f"{key}.onnx"
                models.pop(key, None)
                failures.pop(key, None)
                try:
                    export(spec, exporter, dynamic, path)
                except Exception as exc:  # noqa: BLE001 - recorded in the manifest
                    line = _summary(exc)
                    failures[key] = f"{type(exc).__name__}: {line[:300]}"
                    if os.environ.get("EXPORT_DEBUG"):
                        traceback.print_exc()
                    if path.exists():
                        path.unlink()
                    print(f"{key}: FAILED {failures[key]}", file=sys.stderr)
                    continue
                size = path.stat().st_size
                models[key] = {"file": path.name, "model": spec.name, "family": spec.family,
                               "exporter": exporter, "opset": EXPORTERS[exporter][1],
                               "dynamic": dynamic, "bytes": size,
                               "inputs": _input_record(path)}
                print(f"{key}: {size:,} bytes", file=sys.stderr)
                if size > MAX_FILE_BYTES:
                    print(f"{key}: over {MAX_FILE_BYTES:,} bytes", file=sys.stderr)
    manifest["models"] = dict(sorted(models.items()))
    manifest["failures"] = dict(sorted(failures.items()))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum(m["bytes"] for m in manifest["models"].values())
    print(f"total {total:,} bytes in {len(manifest['models'])} files", file=sys.stderr)
    return 0 if total <= MAX_TOTAL_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
