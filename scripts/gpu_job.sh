#!/usr/bin/env bash
# The GPU job, run on the H200 machine from the repository root over a build made elsewhere:
#   scripts/gpu_job.sh [stage...]     stages: tests sanitize bench flashinfer anchors fuzz ncu
#                                     ncu-flashinfer cp python transformers variants qlen tree
#                                     (default: tests sanitize bench flashinfer anchors fuzz)
# Env: BUILD (default build-gpu), OUT (logs; default ./out), FLASHINFER (FlashInfer's decode
# benchmark binary, default build-peers/fi_decode_bench, built by bench/peers/flashinfer/build.sh;
# the seed's kernels run from bench/peers/seed/), SHAPES=quick for a short benchmark list, SHAPES=anchors
# for the anchor shapes alone (bf16).
# Logs: tests.log, sanitize.log, bench.csv, bench.log, anchors.log (+ the anchors' own CSV),
# flashinfer.csv, flashinfer.log, fuzz.log, ncu.log, cp.log, cp_bench.csv, python.log,
# variants.csv, transformers.log, transformers.csv, summary.txt.
# variants: plain decode against each attention variant and all of them, on three anchor shapes
# (bf16) and one f32 shape (the CUDA-core path). qlen: multi-token queries (q_len 1 to 16) on
# the large-KV shapes, ours and FlashInfer's prefill path (qlen.csv, fi_qlen.csv). tree: q_len 2,
# 4 and 8 with and without tree masks on the same shapes, each pair back to back (tree.csv).
# cp: context-parallel decode over NCCL on every visible GPU (NCCL from the machine's
# nvidia-nccl-cu13 wheel; NCCL_NVLS_ENABLE=0 keeps NVLink multicast off). python: builds the
# Python package for this machine's python3 (PYDEPS: a prefix with xsimd and Eigen's CMake
# packages where the machine lacks them) and runs its tests and examples on the GPU.
# transformers: Hugging Face Transformers' continuous batching with attn_implementation="pagedattn"
# (needs no BUILD): installs a folder of wheels (TFWHEELS, default wheels/transformers: transformers
# 5.25.0 and its dependencies for this machine's python3, torch excepted, which is the machine's;
# scikit-build-core for the build) without the network, builds the Python package as the python
# stage does, runs the integration's tests on the GPU (f32 and bf16) and
# python/examples/transformers_throughput.py (decode tokens/s against Transformers' own paged
# attention; 4K-token prompts at batch 8, 32 and 128, then 1K and 8K).
# Every stage has its own timeout so a hang cannot eat the job.
set -uo pipefail
export PYTHONUNBUFFERED=1
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests sanitize bench flashinfer anchors fuzz)
FLASHINFER=${FLASHINFER:-build-peers/fi_decode_bench}
TESTS="$BUILD/tests/pagedattn_tests"
BENCH="$BUILD/bench/pagedattn-bench"
SUMMARY="$OUT/summary.txt"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "# gpu job $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader \
  | tee -a "$SUMMARY"

has() { local s; for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if has tests; then
  # Every CUDA test: the shared reference grid's CUDA rows, the CUDA suite, cache writes, and
  # the tree-mask tests that run every backend.
  timeout 200 "$TESTS" --gtest_filter='*cuda*:*Cuda*:TreeMaskBackends.*' --gtest_brief=1 \
    > "$OUT/tests.log" 2>&1
  rc=$?
  note "tests rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|tests? from .* ran' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
  # The CPU backend on this host too (AgreesWithCpu compares the two on identical inputs).
  timeout 120 "$TESTS" --gtest_filter='Grid/BackendReferenceTest.*/cpu_*_d128_*' --gtest_brief=1 \
    > "$OUT/tests_cpu.log" 2>&1
  note "cpu rows on this host rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$OUT/tests_cpu.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/tests_cpu.log" | head -5 | tee -a "$SUMMARY"
  grep -m1 -E 'avx512|model name' /proc/cpuinfo | cut -c1-80 | tee -a "$SUMMARY"
  grep -o -m1 -E 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a "$SUMMARY"; echo
fi

if has sanitize; then
  SMALL='CudaDecode.StreamAndWorkspace:CudaDecode.ConcurrentStreamsUseSeparateWorkspaces:*NonFinite*cuda_bf16*:*Merge*cuda*:CudaDecode.UncheckedCorruptTablesStayInBounds:CudaDecode.UncheckedCorruptQueryIndptrStaysInBounds:CudaDecode.CheckedModeReportsTheCpuErrors:CudaDecode.GraphReplayWithNewLengths:CudaDecode.MixedDtypes:CudaDecode.BlockSizes:*cuda_bf16_d80_bs7_g*_ctx1000:*cuda_f32_d256_bs1_g4_ctxBSp1:*cuda_f16_d64_bs32_gall_ctx1000:*VariantReference*cuda_all_bf16_d128_bs16_g8:*VariantReference*cuda_all_f32_d80_bs7_g1:*VariantReference*cuda_window_bf16_d128_bs1_g16:VariantCuda.*:*VariantBackend.EmptyContext*cuda:*VariantBackend.SinksOnly*cuda:*QueryTokenReference*cuda_all_bf16*:*QueryTokenReference*cuda_all_f32_d80*:*QueryTokenCausality*cuda*:*QueryTokenUnread*cuda*:*QueryTokenLayout*cuda:QueryTokenValidation.Cuda*:*CacheLayouts*cuda_*bf16*:*CacheOpLayouts*cuda*:CacheLayoutValidation.*:*Fp8ReferenceTest*cuda_fp8_e4m3_bf16_d128_bs16_g8*:*Fp8ReferenceTest*cuda_fp8_e5m2_f32_d64_bs1_g1*:*CacheWriteDTypes*Cuda*fp8*:*Fp8ReferenceTest*cuda_int8_bf16_d128_bs16_g8*:*Fp8ReferenceTest*cuda_int8_f32_d80_bs1_g1*:*CacheWriteDTypes*Cuda*int8*:*QueryTokenReference*cuda_all_bf16_d96_bs7_g16_int8:TokenScalesCuda.*:Int8Writes.Cuda*:CudaVariantPolicy.*:*TreeMaskGrid.Cuda*/bf16*:TreeMaskBackends.*:TreeMaskValidation.Cuda*:MlaCuda.*:Mla/MlaCudaGrid.*_h16_*'
  {
    echo "## memcheck"
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTS" \
      --gtest_filter="$SMALL" --gtest_brief=1
    echo "memcheck rc=$?"
    echo "## racecheck"
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 "$TESTS" \
      --gtest_filter='CudaDecode.StreamAndWorkspace:CudaDecode.ConcurrentStreamsUseSeparateWorkspaces:*cuda_bf16_d128_bs16_g8_ctx1000:*cuda_f32_d64_bs7_g4_ctx1000:*cuda_bf16_d64_bs16_g1_ctx1000:*VariantReference*cuda_all_bf16_d64_bs16_g4:*VariantReference*cuda_all_f16_d80_bs7_g1:CudaVariantPolicy.WideRows*:TokenScalesCuda.TheNhdOrder:MlaCuda.OneSplitMatchesTheSplitPlan:Mla/MlaCudaGrid.*e4m3*_h16_q2_bs64*' \
      --gtest_brief=1
    echo "racecheck rc=$?"
  } > "$OUT/sanitize.log" 2>&1
  note "$(grep -E 'rc=|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tr '\n' ' ')"
fi

CEILING=""
if has bench; then
  ANCHOR_SHAPES=(1,32,8,128,4096 1,32,8,128,32768 1,32,8,128,131072 8,32,8,128,4096
    8,32,8,128,32768 32,32,8,128,1024 32,32,8,128,4096 32,32,8,128,16384 128,32,8,128,1024
    128,32,8,128,4096 64,64,8,128,4096 32,32,32,128,4096 32,32,4,64,4096)
  EXTRA_SHAPES=(32,32,8,256,4096 32,32,8,64,4096 32,32,8,128,4096,1 32,32,8,128,4096,32
    32,32,8,128,4096,64 32,64,4,128,4096)
  [ "${SHAPES:-}" = quick ] && ANCHOR_SHAPES=(1,32,8,128,4096 1,32,8,128,131072 32,32,8,128,4096
    32,32,32,128,4096) && EXTRA_SHAPES=()
  [ "${SHAPES:-}" = anchors ] && EXTRA_SHAPES=()
  args=()
  for s in "${ANCHOR_SHAPES[@]}"; do args+=(--shape "$s"); done
  extra=()
  for s in "${EXTRA_SHAPES[@]}"; do extra+=(--shape "$s"); done
  timeout 300 "$BENCH" --backend cuda --dtype bf16 --csv "${args[@]}" "${extra[@]}" \
    > "$OUT/bench.csv" 2> "$OUT/bench.log"
  note "bench bf16 rc=$?"
  if [ -z "${SHAPES:-}" ]; then
    # f16 on every anchor shape (against bf16), f32 on the GQA shapes of groups 4, 8 and 16.
    timeout 200 "$BENCH" --backend cuda --dtype f16 --csv "${args[@]}" 2>> "$OUT/bench.log" \
      | tail -n +2 >> "$OUT/bench.csv"
    note "bench f16 rc=$?"
    timeout 120 "$BENCH" --backend cuda --dtype f32 --csv --shape 32,32,8,128,4096 \
      --shape 32,64,4,128,4096 --shape 32,64,8,128,4096 2>> "$OUT/bench.log" \
      | tail -n +2 >> "$OUT/bench.csv"
    note "bench f32 rc=$?"
  fi
  CEILING=$(grep -oE 'GPU read bandwidth: [0-9.]+' "$OUT/bench.log" | head -1 | awk '{print $4}')
  note "read ceiling ${CEILING} GB/s"
  # Skewed batch: one 131072-token sequence among 63 of 1024 (bf16, block 16, graph replay).
  timeout 120 "$BENCH" --backend cuda --dtype bf16 --csv --shape 64,32,8,128,1024 \
    --long-first 131072 2>> "$OUT/bench.log" | tail -n +2 | sed 's/^cuda,/cuda-skew131072,/' \
    >> "$OUT/bench.csv"
  note "skewed batch rc=$?"
  cat "$OUT/bench.csv" | tee -a "$SUMMARY" > /dev/null
fi

if has variants; then
  VSHAPES=(--shape 1,32,8,128,32768 --shape 32,32,8,128,4096 --shape 128,32,8,128,4096)
  : > "$OUT/variants.csv"
  for v in "plain" "--soft-cap 30" "--alibi" "--sinks" "--window 1023" \
    "--soft-cap 30 --alibi --sinks" "--soft-cap 30 --alibi --sinks --window 1023"; do
    flags=()
    [ "$v" != plain ] && read -r -a flags <<< "$v"
    echo "## bf16 $v" >> "$OUT/variants.csv"
    timeout 120 "$BENCH" --backend cuda --dtype bf16 --csv "${VSHAPES[@]}" "${flags[@]}" \
      >> "$OUT/variants.csv" 2>> "$OUT/variants.log"
    note "variants bf16 '$v' rc=$?"
  done
  for v in "plain" "--soft-cap 30 --alibi --sinks"; do
    flags=()
    [ "$v" != plain ] && read -r -a flags <<< "$v"
    echo "## f32 $v" >> "$OUT/variants.csv"
    timeout 120 "$BENCH" --backend cuda --dtype f32 --csv --shape 32,32,8,128,4096 "${flags[@]}" \
      >> "$OUT/variants.csv" 2>> "$OUT/variants.log"
    note "variants f32 '$v' rc=$?"
  done
  cat "$OUT/variants.csv" >> "$SUMMARY"
fi

if has qlen; then
  # Multi-token queries: every sequence with q_len 1, 4 and 8 query tokens (bf16, graph replay)
  # on the shapes of >= 512 MB of KV plus 32x4096, then FlashInfer's tensor-core prefill path
  # with the same query tokens and a causal mask.
  QSHAPES=(1,32,8,128,131072 8,32,8,128,32768 32,32,8,128,4096 32,32,8,128,16384
    128,32,8,128,4096 32,32,32,128,4096 64,64,8,128,4096)
  args=()
  for s in "${QSHAPES[@]}"; do args+=(--shape "$s"); done
  : > "$OUT/qlen.csv"
  for n in 1 2 4 8 16; do
    timeout 150 "$BENCH" --backend cuda --dtype bf16 --csv --q-len "$n" "${args[@]}" \
      2>> "$OUT/qlen.log" | { [ "$n" = 1 ] && cat || tail -n +2; } >> "$OUT/qlen.csv"
    note "qlen $n rc=$?"
  done
  timeout 150 "$BENCH" --backend cuda --dtype bf16 --csv --q-len 4 --soft-cap 30 --alibi \
    --sinks --window 1023 --shape 32,32,8,128,4096 --shape 128,32,8,128,4096 \
    2>> "$OUT/qlen.log" | tail -n +2 | sed 's/^cuda,/cuda-variants,/' >> "$OUT/qlen.csv"
  note "qlen 4 with variants rc=$?"
  grep -m1 -E 'GPU read bandwidth' "$OUT/qlen.log" | tee -a "$SUMMARY"
  if [ -x "$FLASHINFER" ]; then
    : > "$OUT/fi_qlen.csv"
    for n in 1 2 4 8 16; do
      timeout 150 "$FLASHINFER" --backend tc --q-len "$n" "${args[@]}" 2>> "$OUT/fi_qlen.log" \
        | { [ "$n" = 1 ] && cat || tail -n +2; } >> "$OUT/fi_qlen.csv"
      note "flashinfer qlen $n rc=$?"
    done
    cat "$OUT/fi_qlen.csv" >> "$SUMMARY"
  fi
  cat "$OUT/qlen.csv" >> "$SUMMARY"
fi

if has tree; then
  # Tree masks against the causal rule at the same q_len (bf16, graph replay), back to back.
  TSHAPES=(--shape 8,32,8,128,32768 --shape 32,32,8,128,4096 --shape 32,32,8,128,16384
    --shape 128,32,8,128,4096 --shape 32,32,32,128,4096)
  : > "$OUT/tree.csv"
  for n in 2 4 8; do
    for tree in "" --tree-mask; do
      timeout 100 "$BENCH" --backend cuda --dtype bf16 --csv --q-len "$n" $tree "${TSHAPES[@]}" \
        2>> "$OUT/tree.log" | { [ -s "$OUT/tree.csv" ] && tail -n +2 || cat; } >> "$OUT/tree.csv"
      note "tree q_len $n '${tree}' rc=$?"
    done
  done
  grep -m1 -E 'GPU read bandwidth' "$OUT/tree.log" | tee -a "$SUMMARY"
  cat "$OUT/tree.csv" >> "$SUMMARY"
fi

if has fuzz; then
  # The differential fuzzer on both backends (FUZZ_SECONDS, default 60).
  timeout $(( ${FUZZ_SECONDS:-60} + 60 )) "$BUILD/fuzz/pagedattn-fuzz" --backend cpu,cuda \
    --seconds "${FUZZ_SECONDS:-60}" > "$OUT/fuzz.log" 2>&1
  note "fuzz rc=$? $(tail -n 3 "$OUT/fuzz.log" | tr '\n' ' ')"
fi

if has flashinfer; then
  # FlashInfer's two decode paths on the 13 anchor shapes (its defaults: bf16, block 16,
  # fragmented tables, CUDA-graph replay, inputs rotated over >= 4x the L2), in this job.
  timeout 300 "$FLASHINFER" --backend both > "$OUT/flashinfer.csv" 2> "$OUT/flashinfer.log"
  note "flashinfer rc=$?"
  cat "$OUT/flashinfer.csv" >> "$SUMMARY"
fi

if has anchors; then
  [ -n "$CEILING" ] && export READ_CEILING_GBPS=$CEILING
  OUT="$OUT" timeout 300 python3 bench/peers/seed/gpu_anchors.py > "$OUT/anchors.log" 2>&1
  note "anchors rc=$?"
fi

if has ncu; then
  # A long single sequence, a large GQA batch and the MHA shape (CUDA cores): achieved
  # bandwidth, occupancy and stall reasons of one split-kernel launch each (NCU_SHAPES,
  # NCU_KERNELS as a regex and NCU_COUNT launches override).
  for shape in ${NCU_SHAPES:-1,32,8,128,131072 32,32,8,128,16384 32,32,32,128,4096}; do
    echo "## ncu bf16 $shape" >> "$OUT/ncu.log"
    timeout 150 ncu --clock-control none --kernel-name "regex:${NCU_KERNELS:-split_kernel}" \
      --launch-skip 40 \
      --launch-count "${NCU_COUNT:-1}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SchedulerStats --metrics 'regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct' \
      "$BENCH" --backend cuda --dtype bf16 --csv --shape "$shape" \
      >> "$OUT/ncu.log" 2>&1
    note "ncu $shape rc=$?"
  done
fi
if has ncu-flashinfer; then
  # The same metrics for FlashInfer's tensor-core decode (its prefill kernel at query length 1).
  for shape in ${NCU_SHAPES:-1,32,8,128,131072 32,32,8,128,16384 32,32,32,128,4096}; do
    echo "## ncu flashinfer-tc $shape" >> "$OUT/ncu.log"
    timeout 150 ncu --clock-control none --kernel-name "regex:BatchPrefill" --launch-skip 20 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SchedulerStats --metrics 'regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct' \
      "$FLASHINFER" --backend tc --reps 30 --graph-reps 2 --shape "$shape" \
      >> "$OUT/ncu.log" 2>&1
    note "ncu flashinfer $shape rc=$?"
  done
fi
if has cp; then
  export NCCL_NVLS_ENABLE=0
  nccl_lib=$(python3 -c "import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
  export LD_LIBRARY_PATH="${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    nvidia-smi topo -m
    echo "## nccl tests"
    timeout 300 "$BUILD/tests/pagedattn_nccl_tests" --gtest_brief=1
    echo "nccl tests rc=$?"
    echo "## context-parallel tests on one GPU (staged communicator)"
    timeout 300 "$TESTS" --gtest_filter='*ContextParallel*' --gtest_brief=1
    echo "cp tests rc=$?"
    echo "## memcheck"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTS" \
      --gtest_filter='All/ContextParallel.*/cuda_3ranks*' --gtest_brief=1
    echo "cp memcheck rc=$?"
  } > "$OUT/cp.log" 2>&1
  note "$(grep -E 'rc=|^\[  PASSED  \]|^\[  FAILED  \]|ERROR SUMMARY' "$OUT/cp.log" | tr '\n' ' ')"
  CP="$BUILD/bench/pagedattn-cp-bench"
  gpus=$(nvidia-smi -L | wc -l)
  all=$(seq -s, 0 $((gpus - 1)))
  timeout 300 "$CP" --backend cuda --gpus "$all" --csv > "$OUT/cp_bench.csv" 2>> "$OUT/cp.log"
  note "cp-bench all-gather rc=$?"
  timeout 200 "$CP" --backend cuda --gpus "$all" --root 0 --csv 2>> "$OUT/cp.log" | tail -n +2 \
    >> "$OUT/cp_bench.csv"
  note "cp-bench gather rc=$?"
  timeout 200 "$CP" --backend cuda --gpus 0 --csv 2>> "$OUT/cp.log" | tail -n +2 \
    >> "$OUT/cp_bench.csv"
  note "cp-bench one GPU rc=$?"
  cat "$OUT/cp_bench.csv" >> "$SUMMARY"
fi

if has python; then
  # Built here (the machine's python3 differs from the build machine's); CUDA for this GPU only.
  [ -n "${PYDEPS:-}" ] && export CMAKE_PREFIX_PATH="$(cd "$PYDEPS" && pwd)"
  site=$(mktemp -d)
  {
    echo "## pip install"
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90-real -DPAGEDATTN_NCCL=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 500 python3 -m pip install -q \
      --no-build-isolation --no-deps --target "$site" .
    echo "pip rc=$?"
    echo "## pytest"
    PYTHONPATH=$site timeout 300 python3 -m pytest -q -rs python/tests
    echo "pytest rc=$?"
    echo "## call overhead (CUDA, plain launches)"
    for shape in 1,32,8,128,4096 1,32,8,128,1 32,32,8,128,16384 128,32,8,128,4096; do
      PYTHONPATH=$site timeout 120 python3 python/examples/call_overhead.py --device cuda \
        --shape $shape --calls 500
    done
    echo "## the C++ call, plain launches"
    timeout 120 "$BENCH" --backend cuda --plain --csv --shape 1,32,8,128,4096 --shape 1,32,8,128,1 \
      --shape 32,32,8,128,16384 --shape 128,32,8,128,4096
    echo "## decode loop"
    PYTHONPATH=$site timeout 200 python3 python/examples/decode_loop.py --device cuda
    echo "examples rc=$?"
  } > "$OUT/python.log" 2>&1
  note "$(grep -E 'rc=|passed|failed' "$OUT/python.log" | tr '\n' ' ')"
fi
if has transformers; then
  # The wheels go to a folder of their own on PYTHONPATH, ahead of the machine's site-packages
  # (--no-deps: exactly the folder's wheels; numpy, torch and triton stay the machine's).
  [ -n "${PYDEPS:-}" ] && export CMAKE_PREFIX_PATH="$(cd "$PYDEPS" && pwd)"
  TFWHEELS=${TFWHEELS:-wheels/transformers}
  tfsite=$(mktemp -d)
  {
    echo "## wheels ($TFWHEELS)"
    if ls "$TFWHEELS"/*.whl > /dev/null 2>&1; then
      timeout 180 python3 -m pip install -q --no-index --no-deps --target "$tfsite" \
        "$TFWHEELS"/*.whl
      echo "wheels rc=$?"
    else
      echo "no wheels in '$TFWHEELS': using the machine's transformers, if any"
    fi
    echo "## pip install"
    PYTHONPATH=$tfsite CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90-real -DPAGEDATTN_NCCL=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 400 python3 -m pip install -q \
      --no-build-isolation --no-deps --target "$tfsite" .
    echo "pip rc=$?"
    PYTHONPATH=$tfsite timeout 60 python3 -c 'import sys, torch, transformers, pagedattn
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__, "pagedattn cuda", pagedattn.cuda_available())'
    echo "## pytest"
    PYTHONPATH=$tfsite timeout 240 python3 -m pytest -q -rs \
      python/tests/test_transformers_integration.py
    echo "pytest rc=$?"
    echo "## throughput: 4K-token prompts"
    PYTHONPATH=$tfsite timeout 240 python3 python/examples/transformers_throughput.py \
      --batch 8,32,128 --prompt 4096 > "$OUT/transformers.csv"
    echo "throughput 4K rc=$?"
    echo "## throughput: 1K and 8K-token prompts (paged|eager skipped)"
    PYTHONPATH=$tfsite timeout 150 python3 python/examples/transformers_throughput.py \
      --batch 8,32,128 --prompt 1024,8192 --impls pagedattn,sdpa | tail -n +2 \
      >> "$OUT/transformers.csv"
    echo "throughput 1K 8K rc=${PIPESTATUS[0]}"
  } > "$OUT/transformers.log" 2>&1
  note "transformers $(grep -E 'rc=|passed|failed' "$OUT/transformers.log" | tr '\n' ' ')"
  grep -E '^(FAILED|ERROR)' "$OUT/transformers.log" | head -10 | tee -a "$SUMMARY"
  cat "$OUT/transformers.csv" >> "$SUMMARY"
fi
note "# done $(date -u +%FT%TZ)"
