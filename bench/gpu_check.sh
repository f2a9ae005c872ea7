#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU that has this repository and nothing else
# (no net corpus, no network):
#   bash bench/gpu_check.sh [--cpu-only] DIR
#
# Steps, each bounded by `timeout` and logged to DIR/<step>.log; a step that fails is
# recorded and the next one runs:
#   env           a Python that imports placer's dependencies: $PYTHON, else python3, else
#                 a venv in DIR/.venv (system packages + `pip install -e .[test]`, where an
#                 index is reachable)
#   gpu           cupy sees a GPU: its name, cupy's and CUDA's versions (and nvidia-smi)
#   gpu_tests     pytest -m gpu (JUnit XML in DIR/gpu_tests.xml)
#   profile_*     `placer profile` of the bundled nets on cuda:0 and on the CPU, and the PCIe
#                 copy curves (--link): DIR/gpu_profile.json, DIR/cpu_profile.json
#   ops_*         bench/gpu_vs_cpu_ops.py per net (bundled and generated in code): per-op GPU
#                 and CPU times beside the cost model's predicted GPU times, from the H200
#                 datasheet profile and from the measured one
#   kernel_check  bench/gpu_kernel_check.py: ResNet-50 convolutions (fwd, bwd data, bwd filter)
#                 and GEMMs through placer's kernels (cuDNN where cupy has it) against the
#                 datasheet profile's predicted times
#   link_compare  bench/link_vs_profile.py: the measured PCIe curves against the profile's
#   plan          `placer plan` of dlrm_small with the measured GPU and CPU profiles
#   summary       bench/gpu_check_summary.py: DIR/summary.txt, printed at the end
# and DIR/gpu_check.tar.gz holds all of DIR but the venv.
#
# The steps keep within GPU_CHECK_BUDGET_S seconds (default 420) less a reserve for the
# summary and the tarball (bounded too), so the whole run ends within 8 minutes, cupy's
# first kernel compilations included; each step gets at most its own limit and what is
# left. GPU_CHECK_NETS overrides the nets of the ops_* steps.
# --cpu-only: for a machine without a GPU. The steps that need one are reported as skipped,
# the ops_* steps run with the GPU emulated on the CPU (CPU times, labelled so), the plan
# uses the H200 datasheet profile.
# Exit status: 0 when every step ran and passed (--cpu-only: every step it runs), 1 when
# one failed, timed out or found no time left; 2 for bad usage.
set -uo pipefail

usage() { echo "usage: bash bench/gpu_check.sh [--cpu-only] DIR" >&2; exit 2; }
CPU_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-only) CPU_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || usage
mkdir -p "$1" || exit 2
OUT="$(cd "$1" && pwd)"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$HERE" || exit 2
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

BUDGET_S="${GPU_CHECK_BUDGET_S:-420}"
RESERVE_S=25          # kept for the summary and the tarball
MIN_STEP_S=5          # a step given less than this is not started
NETS="${GPU_CHECK_NETS:-dlrm_small resnet_small dlrm_b2048 resnet18_b8}"
DATASHEET=h200-141gb-pcie5
START=$(date +%s)
STEPS="$OUT/steps.tsv"
MODE=gpu; [ "$CPU_ONLY" = 1 ] && MODE=cpu-only
HAVE_GPU=0
NO_GPU_NOTE="the GPU was not probed"
PY=""
STATUS=0
printf 'step\tstatus\tseconds\tnote\n' >"$STEPS"
{ echo "mode=$MODE"; echo "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "host=$(hostname)"
  echo "commit=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "budget_s=$BUDGET_S"; echo "nets=$NETS"; } >"$OUT/meta.txt"

record() {  # NAME STATUS SECONDS NOTE
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS"
  case "$2" in ok|skipped) ;; *) STATUS=1 ;; esac
  echo "   $1: $2${4:+ ($4)} [${3}s]"
}

left_s() { echo $(( BUDGET_S - ($(date +%s) - START) - RESERVE_S )); }

step() {  # NAME LIMIT_S COMMAND...: run COMMAND into DIR/NAME.log within the limit and the budget
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$(left_s)
  if [ "$left" -lt "$MIN_STEP_S" ]; then record "$name" no-time 0 "the ${BUDGET_S} s budget is spent"; return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit} s)"
  t0=$(date +%s)
  # SIGINT first: pytest then still writes its report (the JUnit XML) before it stops
  timeout -s INT -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 4 "$OUT/$name.log" | sed 's/^/   | /'
  if [ $rc -eq 0 ]; then record "$name" ok $(( $(date +%s) - t0 )) ""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then record "$name" timeout $(( $(date +%s) - t0 )) "stopped after ${limit} s"
  else record "$name" failed $(( $(date +%s) - t0 )) "exit $rc, see $name.log"
  fi
  return $rc
}

gpu_step() {  # like step, for a step that needs the GPU
  local name=$1
  if [ "$CPU_ONLY" = 1 ]; then record "$name" skipped 0 "--cpu-only"; return 1; fi
  if [ "$HAVE_GPU" = 0 ]; then record "$name" failed 0 "$NO_GPU_NOTE"; return 1; fi
  step "$@"
}

python_ok() { timeout 60 "$1" -c 'import numpy, scipy, networkx, pandas, matplotlib, google.protobuf, jinja2, pytest' 2>&1; }

choose_python() {  # prints the Python to use; the env step's log says what was tried
  local candidate venv="$OUT/.venv" base="${PYTHON:-python3}"
  for candidate in ${PYTHON:+"$PYTHON"} python3; do
    if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate" >&2; then
      echo "$candidate"; return 0
    fi
    echo "env: $candidate lacks a dependency" >&2
  done
  echo "env: making $venv" >&2
  timeout 120 "$base" -m venv --system-site-packages "$venv" >&2 || return 1
  for extras in "[test]" ""; do  # the test extra pins torch, which a local index may lack
    python_ok "$venv/bin/python" >/dev/null && break
    [ "$(( $(left_s) / 2 ))" -ge 30 ] || break
    timeout "$(( $(left_s) / 2 ))" "$venv/bin/python" -m pip install -q -e "$HERE$extras" pytest >&2
  done
  python_ok "$venv/bin/python" >&2 && echo "$venv/bin/python"
}

has_gpu_device() { [ -f "$1" ] && timeout 30 "$PY" -c "from placer.hardware.profiles import load_profile; import sys; load_profile(sys.argv[1]).device('gpu')" "$1" >/dev/null 2>&1; }

# 1. a Python with placer's dependencies
echo "== env"
t0=$(date +%s)
PY=$(choose_python 2>"$OUT/env.log")
if [ -n "$PY" ]; then
  "$PY" -c 'import sys, numpy; print(sys.executable, sys.version.split()[0], "numpy", numpy.__version__)' >>"$OUT/env.log" 2>&1
  record env ok $(( $(date +%s) - t0 )) "$(tail -n 1 "$OUT/env.log")"
else
  record env failed $(( $(date +%s) - t0 )) "no Python with placer's dependencies, see env.log"
  PY=python3
fi

# 2. the GPU
GPU_PROBE='
import cupy
assert cupy.is_available(), "cupy imports but sees no CUDA GPU"
props = cupy.cuda.runtime.getDeviceProperties(0)
name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
gib = props["totalGlobalMem"] / 2**30
runtime = cupy.cuda.runtime.runtimeGetVersion()
count = cupy.cuda.runtime.getDeviceCount()
print(f"{name} | {gib:.1f} GiB | cupy {cupy.__version__} | CUDA runtime {runtime} | {count} GPU(s)")
'
if [ "$CPU_ONLY" = 1 ]; then
  record gpu skipped 0 "--cpu-only"
elif step gpu 60 "$PY" -c "$GPU_PROBE"; then
  HAVE_GPU=1
  command -v nvidia-smi >/dev/null 2>&1 && timeout 20 nvidia-smi >>"$OUT/gpu.log" 2>&1
elif [ -s "$OUT/gpu.log" ]; then
  NO_GPU_NOTE="no CUDA GPU visible: $(tail -n 1 "$OUT/gpu.log" | cut -c1-120)"
fi

# 3. the GPU tests (--cpu-only: they run and skip, which checks the step itself)
step gpu_tests 200 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" tests
if [ "$MODE" = gpu ] && grep -q "no CUDA GPU visible" "$OUT/gpu_tests.log" 2>/dev/null; then
  record gpu_tests failed 0 "gpu tests skipped for want of a GPU"
fi

# 4. profiles: the bundled nets on the GPU and the CPU, the PCIe curves
for net in dlrm_small resnet_small; do
  gpu_step "profile_gpu_$net" 60 "$PY" cli.py profile "placer/examples/data/$net.pbtxt" --device cuda:0 --quiet -o "$OUT/gpu_profile.json"
done
gpu_step link 60 "$PY" cli.py profile --link --device cuda:0 --quiet -o "$OUT/gpu_profile.json"
for net in dlrm_small resnet_small; do
  step "profile_cpu_$net" 45 "$PY" cli.py profile "placer/examples/data/$net.pbtxt" --device cpu --quiet -o "$OUT/cpu_profile.json"
done

# 5. per-op times, GPU vs CPU, with the predicted GPU times
PREDICT=(--gpu-profile "$DATASHEET")
has_gpu_device "$OUT/gpu_profile.json" && PREDICT+=(--gpu-profile "$OUT/gpu_profile.json")
for net in $NETS; do
  args=(bench/gpu_vs_cpu_ops.py "$net" --csv "$OUT/ops_$net.csv" --json "$OUT/ops_$net.json" "${PREDICT[@]}")
  if [ "$CPU_ONLY" = 1 ]; then step "ops_$net" 90 "$PY" "${args[@]}" --emulate-gpu
  else gpu_step "ops_$net" 90 "$PY" "${args[@]}"
  fi
done

gpu_step kernel_check 60 "$PY" bench/gpu_kernel_check.py --gpu-profile "$DATASHEET" --csv "$OUT/kernel_check.csv"

# 6. the measured PCIe curves against the profile's
gpu_step link_compare 30 "$PY" bench/link_vs_profile.py "$OUT/gpu_profile.json" --reference "$DATASHEET" \
  --json "$OUT/link_compare.json"

# 7. one plan from the measured profiles (the datasheet GPU where none was measured)
GPU_PROFILE="$DATASHEET"
has_gpu_device "$OUT/gpu_profile.json" && GPU_PROFILE="$OUT/gpu_profile.json"
CPU_ARGS=()
[ -f "$OUT/cpu_profile.json" ] && CPU_ARGS=(--cpu-profile "$OUT/cpu_profile.json")
step plan 60 "$PY" cli.py plan placer/examples/data/dlrm_small.pbtxt --gpu-profile "$GPU_PROFILE" ${CPU_ARGS[@]+"${CPU_ARGS[@]}"} \
  --plan-out "$OUT/plan_dlrm_small.json" --report "$OUT/plan_dlrm_small.html"

# 8. the summary, then everything into one tarball
timeout 20 "$PY" bench/gpu_check_summary.py "$OUT" >"$OUT/summary.txt" 2>"$OUT/summary.log" \
  || timeout 10 python3 bench/gpu_check_summary.py "$OUT" >"$OUT/summary.txt" 2>>"$OUT/summary.log" \
  || { echo "gpu_check: the summary failed (see summary.log); steps:" >"$OUT/summary.txt"; cat "$STEPS" >>"$OUT/summary.txt"; STATUS=1; }
TMP_TAR="$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
if timeout 30 tar -czf "$TMP_TAR" -C "$(dirname "$OUT")" --exclude="$(basename "$OUT")/.venv" \
     --exclude="$(basename "$OUT")/gpu_check.tar.gz" "$(basename "$OUT")" \
   && chmod 644 "$TMP_TAR" && mv "$TMP_TAR" "$OUT/gpu_check.tar.gz"; then
  TAR_NOTE="everything is in $OUT/gpu_check.tar.gz"
else
  rm -f "$TMP_TAR"; TAR_NOTE="gpu_check: could not write $OUT/gpu_check.tar.gz"; STATUS=1
fi
echo
cat "$OUT/summary.txt"
echo "$TAR_NOTE ($(( $(date +%s) - START )) s in all)"
exit $STATUS
