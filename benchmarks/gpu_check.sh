#!/usr/bin/env bash
# The checks that need a GPU, for one lent H100 or H200 (15 minutes of device time in all, machine start
# included): no package installs, no network, most valuable first, each section capped by `timeout` so that one
# failure or hang does not eat the rest; the caps sum to 420 s, 480 s with each section's 10 s kill grace.
# Writes a table for benchmarks/RESULTS.md to $OUT/gpu_check.md ($OUT: the lent machine's returned folder;
# else ./gpu_check_out), each section's log beside it, each section's time against its cap. The layouts'
# fake-tensor activation measurements are CPU work, precomputed into benchmarks/gpu_check_layouts.json
# (`python benchmarks/gpu_step.py precompute`, on CPU; tests/repo/test_gpu_check.py keeps it current).
#
#   bash benchmarks/gpu_check.sh            # on the GPU (python3 with torch, triton and this checkout)
#   bash benchmarks/gpu_check.sh --cpu-dry  # the same sections on CPU at a CPU's width (tests/repo/test_gpu_check.py)
#
# Sections (cap in seconds on the GPU), by value:
#   1 fit_d1024  (150) the tightest fit: a real training step of d1024 on one GPU in the layout planning/layout.py
#                      picks for this GPU's memory (16 virtual EP shards; on an H100 256 micro-batches of one
#                      sequence, 7.2% predicted free), peak memory vs the prediction (benchmarks/gpu_step.py)
#   2 flex_65k    (35) the hero's 65k-stage attention, a local and a global layer, compiled flex forward + backward:
#                      peak vs the dry run's stand-in _FlexFootprint (a CPU has no flex backward to measure it)
#   3 step_hero   (95) the hero's one-GPU slice (study hero_gpu; accumulated on an H100), as section 1
#   4 kernels     (70) ceilings, each Triton kernel against its reference, fast path vs eager parity, host syncs
#                      (benchmarks/gpu.py --quick --no-blocks)
#   5 one_rank    (35) the distributed per-rank code (FSDP2 + EP, the world-reduced step, the owner-rank
#                      optimizer) on a one-rank NCCL group, against the one-process step
#   6 blocks      (35) compiled recipe block vs compiled plain block (benchmarks/gpu.py, its block section)
# The caps are estimates: no section has run on a GPU in this form yet (d512's step, the former first section,
# runs the same code as d1024's, a smaller fit).
set -u
cd "$(dirname "$0")/.."
MODE=gpu
if [ "${1:-}" = "--cpu-dry" ]; then MODE=cpu; fi
OUTDIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUTDIR"
MD="$OUTDIR/gpu_check.md"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
# a checkout that is not installed (a lent machine: no installs): the package's installed layout, built in /tmp
if ! PYTHONSAFEPATH=1 "$PY" -c 'import marin_ablate.marin' 2>/dev/null; then
  PKG=$(mktemp -d)
  PYTHONSAFEPATH=1 "$PY" -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; from pkgcopy import package_tree; package_tree(Path('$PKG'))" || exit 2
  export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONSAFEPATH=1
DRY=""
if [ "$MODE" = cpu ]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
  DRY="--cpu-dry"
fi
# CPU: the interpreter and a loaded machine are slow, the widths are tiny: longer caps, the same code paths
scale() { if [ "$MODE" = cpu ]; then echo $(( $1 * ${GPU_CHECK_CPU_FACTOR:-4} )); else echo "$1"; fi; }
DEVICE=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo unknown)
T0=$(date +%s)
{
  echo ""
  echo "## $(date -u '+%Y-%m-%d %H:%M') UTC, benchmarks/gpu_check.sh ($MODE) on $DEVICE"
  echo ""
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
  echo ""
  echo "| # | section | status | seconds | cap here | GPU cap | result |"
  echo "|---|---|---|---|---|---|---|"
} > "$MD"
FAILED=0
N=0

GPU_CAPS=0
section() {  # section NAME CAP_SECONDS COMMAND...
  local name=$1 gpu_cap=$2 cap; cap=$(scale "$2"); shift 2
  GPU_CAPS=$((GPU_CAPS + gpu_cap))
  N=$((N + 1))
  local log="$OUTDIR/$N-$name.log" start rc status last
  start=$(date +%s)
  echo "== $N $name (cap ${cap}s) $*"
  timeout --kill-after=10 "$cap" "$@" > "$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="TIMEOUT"; FAILED=1 ;;
    *) status="FAILED rc=$rc"; FAILED=1 ;;
  esac
  # a section's result: its rows (two spaces, then the section name), else its last line
  last=$(grep -E '^  [a-z-]+ ' "$log" | sed -E 's/ +/ /g; s/\|/\//g' | tr '\n' ';' | cut -c1-400)
  [ -z "$last" ] && last=$(tail -n 1 "$log" | sed 's/|/\//g' | cut -c1-200)
  echo "| $N | $name | $status | $(( $(date +%s) - start )) | $cap | $gpu_cap | $last |" >> "$MD"
  echo "   $status in $(( $(date +%s) - start ))s ($log)"
}

section fit_d1024 150 "$PY" benchmarks/gpu_step.py step --study marin535 --rung d1024 --steps 1 $DRY --md "$OUTDIR/rows.md"
section flex_65k 35 "$PY" benchmarks/gpu_step.py flex $DRY --md "$OUTDIR/rows.md"
section step_hero 95 "$PY" benchmarks/gpu_step.py step --study hero_gpu --steps 2 $DRY --md "$OUTDIR/rows.md"
if [ "$MODE" = cpu ]; then
  section kernels 70 "$PY" benchmarks/gpu.py --device cpu --quick --tiny --no-write --no-blocks
else
  section kernels 70 "$PY" benchmarks/gpu.py --quick --no-write --no-blocks
fi
section one_rank 35 "$PY" benchmarks/gpu_step.py one-rank $DRY --md "$OUTDIR/rows.md"
if [ "$MODE" = cpu ]; then
  section blocks 35 "$PY" benchmarks/gpu.py --device cpu --tiny --no-write --blocks-only
else
  section blocks 35 "$PY" benchmarks/gpu.py --no-write --blocks-only
fi

{
  echo ""
  echo "total $(( $(date +%s) - T0 )) s ($MODE); the GPU caps sum to $GPU_CAPS s, $(( GPU_CAPS + 10 * N )) s with the kill grace; rows of the step sections:"
  [ -f "$OUTDIR/rows.md" ] && cat "$OUTDIR/rows.md"
} >> "$MD"
echo "wrote $MD ($(( $(date +%s) - T0 ))s)"
exit $FAILED
