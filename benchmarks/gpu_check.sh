#!/usr/bin/env bash
# The checks that need a GPU, for one lent H100 or H200: under 9 minutes, no package installs, no network,
# most valuable first, each section capped by `timeout` so that one failure or hang does not eat the rest.
# Writes a table for benchmarks/RESULTS.md to $OUT/gpu_check.md ($OUT: the lent machine's returned folder;
# else ./gpu_check_out), each section's log beside it. The layouts' fake-tensor activation measurements are
# CPU work: a MARIN_CACHE_DIR carried from a machine that ran them (planning/layout.py cached_activations)
# saves them here.
#
#   bash benchmarks/gpu_check.sh            # on the GPU (python3 with torch, triton and this checkout)
#   bash benchmarks/gpu_check.sh --cpu-dry  # the same sections on CPU at a CPU's width (tests/repo/test_gpu_check.py)
#
# Sections (cap in seconds on the GPU):
#   1 step_d512   (210) a real training step of d512 on one GPU, in the layout planning/layout.py picks for this
#                       GPU's memory (8 virtual EP shards, accumulated micro-batches), peak memory vs the dry run's
#                       prediction for that config (benchmarks/gpu_step.py)
#   2 one_rank     (35) the distributed per-rank code (FSDP2 + EP, the world-reduced step, the owner-rank
#                       optimizer) on a one-rank NCCL group, against the one-process step
#   3 kernels      (80) ceilings, each Triton kernel against its reference, fast path vs eager parity, host syncs
#                       (benchmarks/gpu.py --quick --no-blocks)
#   4 step_hero   (110) the hero's one-GPU slice (study hero_gpu; accumulated on an H100), as section 1
#   5 blocks       (40) compiled recipe block vs compiled plain block (benchmarks/gpu.py, its block section)
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
  echo "| # | section | status | seconds | cap | result |"
  echo "|---|---|---|---|---|---|"
} > "$MD"
FAILED=0
N=0

section() {  # section NAME CAP_SECONDS COMMAND...
  local name=$1 cap; cap=$(scale "$2"); shift 2
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
  echo "| $N | $name | $status | $(( $(date +%s) - start )) | $cap | $last |" >> "$MD"
  echo "   $status in $(( $(date +%s) - start ))s ($log)"
}

section step_d512 210 "$PY" benchmarks/gpu_step.py step --study marin535 --rung d512 --steps 2 $DRY --md "$OUTDIR/rows.md"
section one_rank 35 "$PY" benchmarks/gpu_step.py one-rank $DRY --md "$OUTDIR/rows.md"
if [ "$MODE" = cpu ]; then
  section kernels 80 "$PY" benchmarks/gpu.py --device cpu --quick --tiny --no-write --no-blocks
else
  section kernels 80 "$PY" benchmarks/gpu.py --quick --no-write --no-blocks
fi
section step_hero 110 "$PY" benchmarks/gpu_step.py step --study hero_gpu --steps 2 $DRY --md "$OUTDIR/rows.md"
if [ "$MODE" = cpu ]; then
  section blocks 40 "$PY" benchmarks/gpu.py --device cpu --tiny --no-write --blocks-only
else
  section blocks 40 "$PY" benchmarks/gpu.py --no-write --blocks-only
fi

{
  echo ""
  echo "total $(( $(date +%s) - T0 )) s; rows of the step sections:"
  [ -f "$OUTDIR/rows.md" ] && cat "$OUTDIR/rows.md"
} >> "$MD"
echo "wrote $MD ($(( $(date +%s) - T0 ))s)"
exit $FAILED
