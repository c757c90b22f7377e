#!/usr/bin/env bash
# shellcheck disable=SC2054  # shapes are one word each: B,H,KV,D,CTX
# Records pagedattn against its peers on one GPU, in one job, one measurement after the other:
# the read ceiling, pagedattn-bench, FlashInfer's fi_decode_bench and fi_mla_bench and the seed's
# Triton kernels, then a combined markdown table (and a plot where matplotlib imports). Runs on
# the GPU machine over binaries built elsewhere: it needs no network, builds nothing but the
# read-ceiling kernel (only where no binary is given and nvcc is present) and installs nothing.
#
#   scripts/gpu_record.sh [--quick] [--build DIR] [--flashinfer BIN] [--fi-mla BIN] [--readbw BIN] OUT_DIR
#
#   --build DIR       pagedattn's CMake build folder, with bench/pagedattn-bench (env BUILD;
#                     default build-gpu)
#   --flashinfer BIN  fi_decode_bench from bench/peers/flashinfer/build.sh (env FLASHINFER;
#                     default build-peers/fi_decode_bench)
#   --fi-mla BIN      fi_mla_bench from bench/peers/flashinfer/build_mla.sh (env FI_MLA;
#                     default build-peers/fi_mla_bench)
#   --readbw BIN      the read-ceiling kernel bench/peers/readbw.cu, built (env READBW; default
#                     build-peers/readbw)
#   --quick           a handful of shapes instead of the full set
#   env PYTHON        the python with torch and triton for the seed kernels (default python3)
#
# What runs (bf16 q; block 16; CUDA-graph replays; inputs rotated past the L2):
#   readbw; pagedattn and FlashInfer on the 13 one-token bf16 anchor shapes, with q_len 4 and 8
#   on the five large shapes, with an fp8 e4m3 cache on the anchor shapes; pagedattn with an int8
#   cache on the anchor shapes, with per-token scales and without, and with an fp8 e4m3 cache and
#   per-token scales (FlashInfer's decode has neither); pagedattn in batch-invariant mode on the
#   anchor shapes; pagedattn with f32 at group sizes 1, 4, 8 and 16 (FlashInfer has no f32); MLA
#   decode, pagedattn-bench --mla beside fi_mla_bench (fa2 and fa3), on batch 1, 32, 128 x heads
#   16, 64, 128 x context 1024, 4096, 32768, page 64, q_len 1 and 2, bf16 and fp8 e4m3 latent
#   caches (bf16 q; both time CUDA-graph replays, FlashInfer its plain calls too); the seed's kernels on the one-token bf16 shapes when torch and triton import. A part
#   that fails is reported and the rest still runs.
# Writes into OUT_DIR: readbw.txt, pagedattn_*.csv, flashinfer_*.csv (the MLA parts'
# pagedattn_mla_*.csv and flashinfer_mla_*.csv), gpu_anchors_graph.csv (the seed's), a .log
# beside each, summary.txt, table.md (scripts/gpu_table.py) and perf_gpu.png.
# Exit status: 0 when every part succeeded, 1 when any failed, 2 on bad arguments.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() {  # $1: the exit status; 0 prints the whole header
  if [ "$1" = 0 ]; then
    sed -n '3,/^set /{/^set /d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  else
    sed -n 's/^#   \(scripts\/gpu_record.sh .*\)/usage: \1/p' "${BASH_SOURCE[0]}" >&2
  fi
  exit "$1"
}

BUILD=${BUILD:-build-gpu}
FLASHINFER=${FLASHINFER:-build-peers/fi_decode_bench}
FI_MLA=${FI_MLA:-build-peers/fi_mla_bench}
READBW=${READBW:-build-peers/readbw}
PYTHON=${PYTHON:-python3}
quick=0 out=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --build) BUILD=${2:?--build needs a folder}; shift ;;
    --flashinfer) FLASHINFER=${2:?--flashinfer needs a binary}; shift ;;
    --fi-mla) FI_MLA=${2:?--fi-mla needs a binary}; shift ;;
    --readbw) READBW=${2:?--readbw needs a binary}; shift ;;
    -h | --help) usage 0 ;;
    -*) echo "gpu_record.sh: unknown flag $1" >&2; usage 2 ;;
    *) [ -z "$out" ] || { echo "gpu_record.sh: one OUT_DIR only, got $out and $1" >&2; usage 2; }
       out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || usage 2
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
BENCH=$BUILD/bench/pagedattn-bench

# Shapes B,H,KV,D,CTX (block 16): the anchors, the large ones for q_len > 1, group sizes for f32.
ONE=(1,32,8,128,4096 1,32,8,128,32768 1,32,8,128,131072 8,32,8,128,4096 8,32,8,128,32768
  32,32,8,128,1024 32,32,8,128,4096 32,32,8,128,16384 128,32,8,128,1024 128,32,8,128,4096
  64,64,8,128,4096 32,32,32,128,4096 32,32,4,64,4096)
LARGE=(8,32,8,128,32768 32,32,8,128,16384 128,32,8,128,4096 64,64,8,128,4096 32,32,32,128,4096)
F32=(32,32,32,128,4096 32,32,8,128,4096 32,64,8,128,4096 32,64,4,128,4096)
# MLA shapes B,H,1,576,CTX,PAGE (one latent row of 512 + 64 per token), the form both
# pagedattn-bench --mla and fi_mla_bench take.
MLA=()
for b in 1 32 128; do
  for h in 16 64 128; do
    for ctx in 1024 4096 32768; do MLA+=("$b,$h,1,576,$ctx,64"); done
  done
done
if [ "$quick" = 1 ]; then
  ONE=(1,32,8,128,4096 1,32,8,128,131072 32,32,8,128,4096 32,32,32,128,4096)
  LARGE=(128,32,8,128,4096 32,32,32,128,4096)
  F32=(32,32,8,128,4096)
  MLA=(1,16,1,576,32768,64 32,128,1,576,4096,64 128,16,1,576,4096,64)
fi
shape_args() { local s; for s in "$@"; do printf -- '--shape\n%s\n' "$s"; done; }
mapfile -t one_args < <(shape_args "${ONE[@]}")
mapfile -t large_args < <(shape_args "${LARGE[@]}")
mapfile -t f32_args < <(shape_args "${F32[@]}")
mapfile -t mla_args < <(shape_args "${MLA[@]}")

SUMMARY=$out/summary.txt
: > "$SUMMARY"
failed=0
note() { echo "$*" | tee -a "$SUMMARY"; }
# part NAME SECONDS CMD...: stdout to NAME.csv, stderr to NAME.log, its status to the summary.
part() {
  local name=$1 secs=$2 rc
  shift 2
  timeout "$secs" "$@" > "$out/$name.csv" 2> "$out/$name.log"
  rc=$?
  [ "$rc" -eq 124 ] && echo "timed out after $secs s" >> "$out/$name.log"
  [ "$rc" -eq 0 ] || failed=1
  note "$name: rc=$rc $( [ "$rc" -eq 0 ] || tail -n 2 "$out/$name.log" | tr '\n' ' ')"
  return "$rc"
}
# mla_parts NAME SECONDS CMD...: a part NAME_mla_KV_qN for each latent cache dtype KV and q_len N,
# CMD given --kv-dtype KV --q-len N and the MLA shapes.
mla_parts() {
  local name=$1 secs=$2 kv n
  shift 2
  for kv in bf16 fp8_e4m3; do
    for n in 1 2; do
      part "${name}_mla_${kv}_q$n" "$secs" "$@" --kv-dtype "$kv" --q-len "$n" "${mla_args[@]}"
    done
  done
}
missing() { note "$1: skipped, $2"; failed=1; }

note "# gpu_record $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null ||
  echo unknown)$( [ "$quick" = 1 ] && echo ' (quick)')"
command -v nvidia-smi > /dev/null &&
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 |
  tee -a "$SUMMARY"

# The read ceiling: a given readbw binary, else one built here where nvcc is, else none (the
# table then takes the ceiling pagedattn-bench measured).
if [ ! -x "$READBW" ] && command -v nvcc > /dev/null; then
  READBW=$(mktemp -d)/readbw
  nvcc -O3 -gencode arch=compute_90,code=sm_90 -o "$READBW" "$root/bench/peers/readbw.cu" \
    > "$out/readbw.log" 2>&1 || note "readbw: nvcc failed (see readbw.log)"
fi
if [ -x "$READBW" ]; then
  timeout 120 "$READBW" > "$out/readbw.txt" 2>> "$out/readbw.log"
  rc=$?
  [ "$rc" -eq 0 ] || failed=1
  note "readbw: rc=$rc $(cat "$out/readbw.txt")"
else
  missing readbw "no binary at $READBW and no nvcc"
fi

if [ -x "$BENCH" ]; then
  bench=("$BENCH" --backend cuda --csv)
  part pagedattn_bf16 400 "${bench[@]}" --dtype bf16 "${one_args[@]}"
  for n in 4 8; do
    part "pagedattn_q$n" 300 "${bench[@]}" --dtype bf16 --q-len "$n" "${large_args[@]}"
  done
  part pagedattn_fp8 400 "${bench[@]}" --dtype bf16 --kv-dtype fp8_e4m3 "${one_args[@]}"
  part pagedattn_int8 400 "${bench[@]}" --dtype bf16 --kv-dtype int8 "${one_args[@]}"
  part pagedattn_int8_ts 400 "${bench[@]}" --dtype bf16 --kv-dtype int8 --token-scales \
    "${one_args[@]}"
  part pagedattn_fp8_ts 400 "${bench[@]}" --dtype bf16 --kv-dtype fp8_e4m3 --token-scales \
    "${one_args[@]}"
  part pagedattn_bi 400 "${bench[@]}" --dtype bf16 --batch-invariant "${one_args[@]}"
  part pagedattn_f32 300 "${bench[@]}" --dtype f32 "${f32_args[@]}"
  # MLA: each shape's latent pools are drawn on the host (up to 4.8 GB at 128 x 32768 in bf16),
  # which takes most of these parts' time.
  mla_parts pagedattn 1500 "${bench[@]}" --mla --dtype bf16
else
  missing pagedattn "no pagedattn-bench at $BENCH (--build)"
fi

if [ -x "$FLASHINFER" ]; then
  part flashinfer_bf16 400 "$FLASHINFER" --backend both "${one_args[@]}"
  for n in 4 8; do
    part "flashinfer_q$n" 300 "$FLASHINFER" --backend tc --q-len "$n" "${large_args[@]}"
  done
  part flashinfer_fp8 400 "$FLASHINFER" --backend both --kv-dtype fp8_e4m3 "${one_args[@]}"
else
  missing flashinfer "no fi_decode_bench at $FLASHINFER (--flashinfer)"
fi

if [ -x "$FI_MLA" ]; then
  mla_parts flashinfer 900 "$FI_MLA" --csv --backend both
else
  missing flashinfer_mla "no fi_mla_bench at $FI_MLA (--fi-mla)"
fi

# The seed's kernels, against the same ceiling (readbw's, else pagedattn-bench's).
ceiling=$(grep -oE 'read ceiling [0-9.]+' "$out/readbw.txt" 2> /dev/null | awk '{print $3}')
[ -n "$ceiling" ] || ceiling=$(grep -ohE 'GPU read bandwidth: [0-9.]+' "$out"/pagedattn_*.log \
  2> /dev/null | head -n 1 | awk '{print $4}')
if "$PYTHON" -c 'import torch, triton' > /dev/null 2>&1; then
  [ -n "$ceiling" ] && export READ_CEILING_GBPS=$ceiling
  OUT=$out timeout 600 "$PYTHON" "$root/bench/peers/seed/gpu_anchors.py" "${one_args[@]}" \
    > "$out/seed.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || failed=1
  note "seed: rc=$rc $( [ "$rc" -eq 0 ] || tail -n 2 "$out/seed.log" | tr '\n' ' ')"
else
  missing seed "torch and triton do not import in $PYTHON"
fi

# The combined table and plot; the read ceiling comes from readbw.txt, else the bench logs.
if "$PYTHON" "$root/scripts/gpu_table.py" --md "$out/table.md" --png "$out/perf_gpu.png" \
  "$out" 2> "$out/table.log"; then
  note "table: $out/table.md ($(tail -n 1 "$out/table.log"))"
else
  failed=1
  note "table: failed (see table.log)"
fi
note "# done $(date -u +%FT%TZ)$( [ "$failed" = 0 ] || echo ', with failures')"
exit "$failed"
