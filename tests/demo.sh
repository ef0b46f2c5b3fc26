#!/usr/bin/env bash
# make demo: a real model (ResNet-50, bundled with the onnx package) through the pipeline:
# import, roll for the H100, weld, ram, generate CUDA (compiled with nvcc when it is
# installed), run on the CPU (whole ops; compiled C++ rolled and welded for this CPU's probed
# profile; tile by tile as rolled and as welded for the GPU), each run checked against
# onnxruntime; then a model with a Loop (an LSTM) through tk-grind, inside the compiled CPU
# library and as a GPU device loop.
# The bundled weights are one constant (0.02) everywhere, which would make the check
# meaningless: the demo gives the same graph seeded random weights.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$here/bin:$PATH"
model=$(python -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__),
  "backend/test/data/light/light_resnet50.onnx"))')
out="$here/out/demo"
mkdir -p "$out"
cd "$out"
PYTHONPATH="$here/tests" python - "$model" <<'PY'
import sys, onnx
from models.onnx_check import with_random_weights
onnx.save(with_random_weights(sys.argv[1], seed=0), "resnet50.onnx")
PY
step() { printf '\n== %s\n' "$*"; }
seconds() { python -c 'import sys,time; print(f"{time.time()-float(sys.argv[1]):.2f} s")' "$1"; }

step "tk-import resnet50.onnx | tk-run --device cpu --check --bench 5"
t=$(date +%s.%N)
tk-import resnet50.onnx -o resnet50.tk.yaml
echo "imported in $(seconds "$t"): IR $(du -h resnet50.tk.yaml | cut -f1), weights $(du -h resnet50.tk.weights.npz | cut -f1)"
tk-import resnet50.onnx | tk-run --device cpu --seed 0 --check --bench 5 --report

step "tk-hw probe --cpu (this CPU as a profile) | tk-roll | tk-weld | tk-codegen (C++) | tk-run --check --bench 5"
tk-hw probe --cpu --quick -o host-cpu.yaml
t=$(date +%s.%N)
tk-roll --hw host-cpu.yaml resnet50.tk.yaml | tk-weld | tk-codegen --emit-dir cpu -o resnet50.cpu.yaml
echo "rolled, welded and generated for this CPU in $(seconds "$t"): $(ls cpu/*.cpp | wc -l) kernels in cpu/"
tk-run resnet50.cpu.yaml --seed 0 --check --bench 5

step "tk-roll --hw h100 (Roller tiles; the five most expensive ops)"
t=$(date +%s.%N)
tk-roll --hw h100 resnet50.tk.yaml -o resnet50.rolled.yaml
echo "rolled in $(seconds "$t")"
python - <<'PY'
import yaml
doc = yaml.safe_load(open("resnet50.rolled.yaml"))
ops = sorted((op for op in doc["ops"] if op.get("tile")), key=lambda o: -o["tile"]["estimate"]["time_us"])
total = sum(o["tile"]["estimate"]["time_us"] for o in doc["ops"] if o.get("tile"))
print(f"estimated H100 time, one kernel per op: {total:.0f} us over {len(doc['ops'])} ops")
for op in ops[:5]:
    t = op["tile"]
    print(f"  {op['name']:<12} block {t['block']} thread {t['thread']} step {t['step']} "
          f"{t['estimate']['time_us']} us ({t['estimate']['bound']}-bound)")
PY

step "tk-run --mode tiled --check (every op block by block, step by step, as rolled)"
tk-run resnet50.rolled.yaml --device cpu --mode tiled --seed 0 --check

step "tk-codegen (CUDA C++ per kernel; compiled with nvcc when present)"
t=$(date +%s.%N)
if command -v nvcc >/dev/null; then
  tk-codegen resnet50.rolled.yaml --compile --emit-dir cuda -o resnet50.cuda.yaml
else
  tk-codegen resnet50.rolled.yaml --emit-dir cuda -o resnet50.cuda.yaml
  echo "(nvcc not found: kernels generated but not compiled)"
fi
echo "generated in $(seconds "$t"): $(ls cuda/*.cu | wc -l) kernels in $out/cuda/"
python - <<'PY'
import collections, yaml
cg = yaml.safe_load(open("resnet50.cuda.yaml"))["codegen"]
shapes = collections.Counter(k["shape"] for k in cg["kernels"])
print("kernel shapes:", dict(sorted(shapes.items())))
res = [k["resources"] for k in cg["kernels"] if "resources" in k]
if res:
    print(f"{cg['arch']}: registers {min(r['registers'] for r in res)}-{max(r['registers'] for r in res)}, "
          f"spills {sum(r['spill_stores'] + r['spill_loads'] for r in res)} bytes")
PY

step "tk-weld (Welder: kernel groups, intermediates on chip), then each group run tile by tile"
t=$(date +%s.%N)
tk-weld resnet50.rolled.yaml --report -o resnet50.welded.yaml 2> weld-report.txt
head -1 weld-report.txt
echo "welded in $(seconds "$t") (the full per-group table: $out/weld-report.txt)"
tk-run resnet50.welded.yaml --device cpu --mode tiled --seed 0 --check

step "tk-ram (Rammer: rTasks packed onto the GPU's execution units as persistent kernels)"
tk-roll --hw h100 --top-k 4 resnet50.tk.yaml | tk-ram --report --svg resnet50.plan.svg \
  -o resnet50.program.yaml 2> ram-report.txt
head -2 ram-report.txt
if command -v nvcc >/dev/null; then
  tk-codegen resnet50.program.yaml --compile --strict -o resnet50.program.cuda.yaml
  python - <<'PY'
import yaml
cg = yaml.safe_load(open("resnet50.program.cuda.yaml"))["codegen"]
programs = [k for k in cg["kernels"] if k["shape"] == "program"]
print(f"{len(cg['kernels'])} kernels, {len(programs)} of them persistent programs; compiled, "
      "co-residency checked against ptxas' registers")
PY
fi
echo "the plan, drawn: $out/resnet50.plan.svg"

step "tk-grind (Cocktailer: an ONNX Loop moved into one kernel: on this CPU, and for the H100), LSTM as a Loop"
PYTHONPATH="$here/tests" python - <<'PY'
import onnx
from models.control_models import lstm_loop
onnx.save(lstm_loop(), "lstm_loop.onnx")
PY
tk-import lstm_loop.onnx | tk-run --device cpu --seed 0 --check
# on this CPU: the loop placed inside the compiled library, one kernel on the OpenMP team
tk-import lstm_loop.onnx | tk-roll --hw host-cpu.yaml | tk-weld | tk-grind --report \
  | tk-codegen | tk-run --seed 0 --check --bench 20
tk-import lstm_loop.onnx | tk-roll --hw h100 | tk-grind --report -o lstm_loop.ground.yaml
if command -v nvcc >/dev/null; then
  tk-codegen lstm_loop.ground.yaml --compile --strict -o lstm_loop.cuda.yaml
  echo "the device loop compiled: one cooperative kernel with grid barriers"
fi

echo
echo "Running the kernels needs a GPU: tk-run resnet50.cuda.yaml --device cuda --seed 0 --check"
echo "(and resnet50.program.cuda.yaml, lstm_loop.cuda.yaml the same way)"
