#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU and cupy:
#   bench/gpu_check.sh DIR
# runs the gpu-marked tests, times every kernel on GPU vs CPU for two corpus nets
# (AlexNet and ResNet-50, converted from Caffe with random weights), measures the PCIe
# copy curves and the bundled nets' GPU op times (`placer profile`), and writes the
# figures into DIR. Fails loudly (exit 1, message on stderr) when no GPU is visible: it never skips.
set -euo pipefail
if [ $# -ne 1 ]; then echo "usage: bench/gpu_check.sh DIR" >&2; exit 2; fi
OUT="$1"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
cd "$HERE"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" - <<'PYEOF' >"$OUT/gpu.txt" 2>&1
import cupy
assert cupy.is_available(), "cupy imports but no CUDA GPU is visible"
props = cupy.cuda.runtime.getDeviceProperties(0)
print(props["name"].decode(), "| cupy", cupy.__version__, "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
PYEOF
then
  cat "$OUT/gpu.txt" >&2
  echo "gpu_check: FAILED: no CUDA GPU visible (or cupy missing); nothing was measured" >&2
  exit 1
fi
cat "$OUT/gpu.txt"

status=0
echo "== gpu-marked tests"
"$PY" -m pytest -q -m gpu -rs tests 2>&1 | tee "$OUT/gpu_tests.txt" || status=1
if ! grep -q " passed" "$OUT/gpu_tests.txt" || grep -q "SKIPPED.*no CUDA GPU" "$OUT/gpu_tests.txt"; then
  echo "gpu_check: FAILED: gpu tests skipped for want of a GPU, or none ran (see $OUT/gpu_tests.txt)" >&2
  status=1
fi

echo "== per-op CPU vs GPU times"
for spec in "bvlc_alexnet_deploy.prototxt 8" "resnet50_ResNet-50-deploy.prototxt 8"; do
  set -- $spec
  "$PY" bench/gpu_vs_cpu_ops.py "$1" --batch "$2" --csv "$OUT/ops_${1%%.*}_b$2.csv" \
    2>&1 | tee -a "$OUT/ops_summary.txt" || status=1
done
"$PY" bench/executor_overhead.py --ops 1000 2>&1 | tee "$OUT/executor_overhead.txt" || status=1

echo "== PCIe copy curves (H2D/D2H, pinned and pageable, 4 KiB .. 1 GiB)"
"$PY" cli.py profile --link --device cuda:0 -o "$OUT/link_profile.json" 2>&1 | tee "$OUT/link.txt" || status=1

echo "== measured GPU op timings of the bundled nets, and a plan with them"
for net in dlrm_small resnet_small; do
  "$PY" cli.py profile "placer/examples/data/$net.pbtxt" --device cuda:0 -o "$OUT/gpu_profile.json" \
    2>&1 | tail -3 | tee -a "$OUT/gpu_profile.txt" || status=1
done
"$PY" cli.py plan placer/examples/data/dlrm_small.pbtxt --gpu-profile "$OUT/gpu_profile.json" \
  --plan-out "$OUT/plan_dlrm_small.json" 2>&1 | tail -12 | tee "$OUT/plan_dlrm_small.txt" || status=1

if [ $status -ne 0 ]; then echo "gpu_check: FAILED (see $OUT)" >&2; fi
exit $status
