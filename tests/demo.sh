#!/usr/bin/env bash
# make demo: a real model (ResNet-50 bundled with the onnx package) through the pipeline,
# checked against onnxruntime and timed. Run from the repository root with .venv/bin on PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$here/bin:$PATH"
model=$(python -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__),
  "backend/test/data/light/light_resnet50.onnx"))')
out="$here/out/demo"
mkdir -p "$out"
cp "$model" "$out/resnet50.onnx"
cd "$out"

echo "== tk-import resnet50.onnx | tk-run --device cpu --check --bench 5"
start=$(date +%s.%N)
tk-import resnet50.onnx -o resnet50.tk.yaml
end=$(date +%s.%N)
printf 'imported in %.2f s (IR %s, weights %s)\n' "$(echo "$end - $start" | bc)" \
  "$(du -h resnet50.tk.yaml | cut -f1)" "$(du -h resnet50.tk.weights.npz | cut -f1)"
tk-import resnet50.onnx | tk-run --device cpu --seed 0 --check --bench 5 --report
