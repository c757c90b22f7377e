# Runs pagedattn-bench on tiny shapes and checks the CSV it prints (format and accuracy only).
cmake_minimum_required(VERSION 3.25)  # the project's policies (script mode sets none)
set(header_want "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,")
string(APPEND header_want "pct_read_bw,rel_err,window,soft_cap,alibi,sinks,q_len,layout,kv_dtype")
set(num "[0-9.eE+-]+")
# Every run's common flags: the CSV, two threads, two timed runs, a short bandwidth pass.
set(quick --csv --threads 2 --iters 2 --min-time 0 --bw-mib 64)

# run_bench(<what> <flag>...): runs pagedattn-bench with the quick flags and these, and fails
# unless it exits 0 (the exit status carries the accuracy against the f64 reference) and prints
# the CSV header (with `header_tail` after it where the caller sets one, then huge_pct, tree,
# token_scales and batch_invariant), and every row's last three columns, tree, token_scales and
# batch_invariant, are 1 with --tree-mask, --token-scales and --batch-invariant among the flags,
# else 0. Sets `rows` (the CSV rows after the header, those three columns cut off) and `err`
# (stderr) in the caller.
function(run_bench what)
  execute_process(COMMAND ${BENCH} ${quick} ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pagedattn-bench ${what} exited with ${rc}:\n${out}\n${err}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(FILTER lines EXCLUDE REGEX "^$")
  list(POP_FRONT lines header)
  if(NOT header STREQUAL "${header_want}${header_tail},huge_pct,tree,token_scales,batch_invariant")
    message(FATAL_ERROR "unexpected CSV header with ${what}: '${header}'")
  endif()
  set(tree 0)
  if("--tree-mask" IN_LIST ARGN)
    set(tree 1)
  endif()
  set(token_scales 0)
  if("--token-scales" IN_LIST ARGN)
    set(token_scales 1)
  endif()
  set(invariant 0)
  if("--batch-invariant" IN_LIST ARGN)
    set(invariant 1)
  endif()
  set(cut "")
  foreach(row IN LISTS lines)
    if(NOT row MATCHES ",${tree},${token_scales},${invariant}$")
      message(FATAL_ERROR "CSV row with ${what} does not end in tree = ${tree}, token_scales = "
                          "${token_scales}, batch_invariant = ${invariant}: '${row}'")
    endif()
    string(REGEX REPLACE ",[01],[01],[01]$" "" row "${row}")
    list(APPEND cut "${row}")
  endforeach()
  set(rows "${cut}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

# check_rows(<what> <count> <regex>): `rows` holds <count> rows (0: any number, the first
# checked alone), each matching <regex>.
function(check_rows what count regex)
  list(LENGTH rows n)
  if(count EQUAL 0)
    list(GET rows 0 first)
    set(checked "${first}")
  elseif(NOT n EQUAL count)
    message(FATAL_ERROR "expected ${count} CSV rows with ${what}, got ${n}:\n${rows}")
  else()
    set(checked "${rows}")
  endif()
  foreach(row IN LISTS checked)
    if(NOT row MATCHES "${regex}")
      message(FATAL_ERROR "malformed CSV row with ${what}: '${row}'")
    endif()
  endforeach()
endfunction()

set(plain_tail "-1,0,0,0,1")  # window, soft_cap, alibi, sinks, q_len of a plain run
foreach(dtype f32 bf16)
  run_bench("--dtype ${dtype}" --dtype ${dtype} --shape 2,8,2,64,100,16 --shape 1,4,4,128,37,8)
  # (cpu, naive) x 2 shapes
  check_rows("--dtype ${dtype}" 4
             "^(cpu|naive),${dtype},[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,${num},${num},${num},${num},${plain_tail},hnd,${dtype},${num}$")
  if(NOT err MATCHES "read bandwidth: ${num} GB/s")
    message(FATAL_ERROR "no read bandwidth line in:\n${err}")
  endif()
endforeach()

# A skewed batch (--long-first): sequence 0 holds 700 tokens, the others 40. The exit status
# carries the CPU backend's accuracy against the f64 reference on it.
run_bench("--long-first" --dtype bf16 --shape 4,8,2,64,40,16 --long-first 700)
check_rows("--long-first" 2 "^(cpu|naive),bf16,4,8,2,64,40,16,")  # cpu + naive

# One thread timed on its own CPU clock: the same rows, and the bandwidth line says so.
run_bench("--clock thread-cpu" --dtype bf16 --shape 2,8,2,64,100,16 --threads 1 --clock thread-cpu)
check_rows("--clock thread-cpu" 2 "^(cpu|naive),bf16,2,8,2,64,100,16,${num},${num},${num},")
if(NOT err MATCHES "read bandwidth: [0-9.]+ GB/s \\(1 threads, [0-9]+ MiB streamed per pass, thread CPU time\\)")
  message(FATAL_ERROR "--clock thread-cpu: unexpected bandwidth line: ${err}")
endif()

# Every attention variant at once, on the CPU backend and the naive baseline: the exit status
# carries both against the f64 reference (the naive one fatal only as --backend naive, so it runs
# on its own too), and the variant columns say what was on.
foreach(backend cpu naive)
  run_bench("--backend ${backend} and every variant" --backend ${backend} --dtype bf16
            --shape 3,8,2,64,100,16 --window 37 --soft-cap 2.5 --alibi --sinks)
  check_rows("--backend ${backend} and every variant" 0
             "^${backend},bf16,3,8,2,64,100,16,${num},${num},${num},${num},37,2.5,1,1,1,hnd,bf16,${num}$")
endforeach()

# Multi-token queries (--q-len): 4 query tokens per sequence, on the CPU backend and the naive
# baseline, plain and with a window and sinks, a context shorter than the query tokens among
# them (--long-first 2: sequence 0's first two tokens attend to nothing). The exit status carries
# both against the f64 reference, and the q_len column says 4.
foreach(backend cpu naive)
  foreach(extra "" "--window 9 --sinks" "--long-first 2")
    separate_arguments(extra_args UNIX_COMMAND "${extra}")
    run_bench("--backend ${backend} --q-len 4 ${extra}" --backend ${backend} --dtype bf16
              --shape 3,8,2,64,100,16 --q-len 4 ${extra_args})
    check_rows("--backend ${backend} --q-len 4 ${extra}" 0
               "^${backend},bf16,3,8,2,64,100,16,${num},${num},${num},${num},-?[0-9]+,0,0,[01],4,hnd,bf16,${num}$")
  endforeach()
endforeach()

# Tree masks (--tree-mask): a random token tree over each sequence's query tokens, on the CPU
# backend and the naive baseline (on its own too, so its accuracy is fatal), plain and with every
# variant, a context shorter than the query tokens among them (--long-first 3). The exit status
# carries both against the f64 reference with the same masks; run_bench checks the tree column.
foreach(backend cpu naive)
  foreach(extra "" "--window 9 --soft-cap 2.5 --alibi --sinks" "--long-first 3")
    separate_arguments(extra_args UNIX_COMMAND "${extra}")
    run_bench("--backend ${backend} --q-len 5 --tree-mask ${extra}" --backend ${backend}
              --dtype bf16 --shape 3,8,2,64,100,16 --q-len 5 --tree-mask ${extra_args})
    check_rows("--backend ${backend} --q-len 5 --tree-mask ${extra}" 0
               "^${backend},bf16,3,8,2,64,100,16,${num},${num},${num},${num},-?[0-9]+,[0-9.]+,[01],[01],5,hnd,bf16,${num}$")
  endforeach()
endforeach()
run_bench("--tree-mask --layout combined_nhd --kv-dtype fp8_e4m3" --dtype f32 --shape 2,8,2,64,70,8
          --q-len 8 --tree-mask --layout combined_nhd --kv-dtype fp8_e4m3)
check_rows("--tree-mask --layout combined_nhd --kv-dtype fp8_e4m3" 2
           "^(cpu|naive),f32,2,8,2,64,70,8,${num},${num},${num},${num},-1,0,0,0,8,combined_nhd,fp8_e4m3,${num}$")

# The caches in the NHD layout and in one combined tensor (--layout): both backends read them
# through kv_strides, the exit status carries each against the f64 reference (the naive one run
# on its own for that), and the layout column names the layout. Once with multi-token queries
# and a window too.
foreach(layout nhd combined_nhd)
  foreach(backend cpu naive)
    run_bench("--backend ${backend} --layout ${layout}" --backend ${backend} --dtype bf16
              --shape 2,8,2,64,100,16 --shape 1,4,4,128,37,8 --layout ${layout})
    check_rows("--backend ${backend} --layout ${layout}" 0
               "^${backend},bf16,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,${num},${num},${num},${num},${plain_tail},${layout},bf16,${num}$")
  endforeach()
endforeach()
run_bench("--layout nhd --q-len 3 --window 20" --dtype f16 --shape 3,8,2,64,100,16 --layout nhd
          --q-len 3 --window 20)
check_rows("--layout nhd --q-len 3 --window 20" 2
           "^(cpu|naive),f16,3,8,2,64,100,16,${num},${num},${num},${num},20,0,0,0,3,nhd,f16,${num}$")

# fp8 caches (--kv-dtype) read by a bf16 q and out: the CPU backend and the naive baseline (on
# its own too, so its accuracy is fatal), the exit status carrying each against the f64 reference
# of the same codes, and the kv_dtype column naming the cache's dtype while dtype stays bf16. Then
# e5m2 under an f32 q and out, in one combined tensor, with multi-token queries and a window.
foreach(backend cpu naive)
  run_bench("--backend ${backend} --kv-dtype fp8_e4m3" --backend ${backend} --dtype bf16
            --kv-dtype fp8_e4m3 --shape 2,8,2,64,100,16 --shape 1,4,4,128,37,8)
  check_rows("--backend ${backend} --kv-dtype fp8_e4m3" 0
             "^${backend},bf16,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,${num},${num},${num},${num},${plain_tail},hnd,fp8_e4m3,${num}$")
endforeach()
run_bench("--kv-dtype fp8_e5m2 --layout combined_nhd --q-len 3 --window 20" --dtype f32
          --kv-dtype fp8_e5m2 --shape 3,8,2,64,100,16 --layout combined_nhd --q-len 3 --window 20)
check_rows("--kv-dtype fp8_e5m2 --layout combined_nhd --q-len 3 --window 20" 2
           "^(cpu|naive),f32,3,8,2,64,100,16,${num},${num},${num},${num},20,0,0,0,3,combined_nhd,fp8_e5m2,${num}$")

# int8 caches, and per-token scales (--token-scales) on int8 and fp8: the CPU backend and the
# naive baseline, each against the f64 reference of the same codes and scales.
run_bench("--kv-dtype int8" --dtype bf16 --kv-dtype int8 --shape 2,8,2,64,100,16)
check_rows("--kv-dtype int8" 2
           "^(cpu|naive),bf16,2,8,2,64,100,16,${num},${num},${num},${num},${plain_tail},hnd,int8,${num}$")
foreach(kv int8 fp8_e4m3)
  run_bench("--kv-dtype ${kv} --token-scales" --dtype f32 --kv-dtype ${kv} --token-scales
            --shape 2,8,2,128,100,16 --q-len 2)
  check_rows("--kv-dtype ${kv} --token-scales" 2
             "^(cpu|naive),f32,2,8,2,128,100,16,${num},${num},${num},${num},-1,0,0,0,2,hnd,${kv},${num}$")
endforeach()

# int4 caches (group scales always): the CPU backend and the naive baseline against the reference,
# dense and NHD; CUDA refuses them by name.
foreach(layout hnd nhd)
  run_bench("--kv-dtype int4 --layout ${layout}" --dtype bf16 --kv-dtype int4
            --shape 2,8,2,128,100,16 --layout ${layout})
  check_rows("--kv-dtype int4 --layout ${layout}" 2
             "^(cpu|naive),bf16,2,8,2,128,100,16,${num},${num},${num},${num},${plain_tail},${layout},int4,${num}$")
endforeach()
execute_process(COMMAND ${BENCH} ${quick} --shape 1,4,4,64,16 --kv-dtype int4 --backend cuda
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--kv-dtype = 'int4'")
  message(FATAL_ERROR "--kv-dtype int4 --backend cuda: exit status ${rc}, expected 2 and a "
                      "message naming the flag:\n${err}")
endif()

# A layout the benchmark does not offer is refused before anything is measured, naming --layout.
execute_process(COMMAND ${BENCH} ${quick} --shape 1,4,4,64,16 --layout padded_hnd
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--layout = 'padded_hnd'")
  message(FATAL_ERROR "--layout padded_hnd: exit status ${rc}, expected 2 and a message naming "
                      "the flag:\n${err}")
endif()

# --limits: each CPU row gains its compute bound (one thread in cache times --threads), its
# pattern read on 4 KiB pages, the share of the lower bound it reached, which bound that is, and
# its pattern read on huge pages; the naive rows leave them empty.
set(header_tail ",compute_gbps,pattern_gbps,pct_bound,bound,pattern_huge_gbps")
run_bench("--limits" --dtype bf16 --shape 2,8,2,64,100,16 --limits)
unset(header_tail)
check_rows("--limits" 2
           "^(cpu,bf16,.*,hnd,bf16,${num},${num},${num},(read|compute),${num}|naive,bf16,.*,hnd,bf16,,,,,),${num}$")
# The bound is for CPU rows: another backend is refused, naming the flag.
execute_process(COMMAND ${BENCH} ${quick} --shape 1,4,4,64,16 --backend naive --limits
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--limits")
  message(FATAL_ERROR "--limits --backend naive: exit status ${rc}, expected 2 and a message "
                      "naming the flag:\n${err}")
endif()

# --huge-pages off: the pools refuse transparent huge pages (MADV_NOHUGEPAGE), so none of their
# bytes is on one, whatever the system's policy; on (the default) is a share in [0, 100].
run_bench("--huge-pages off" --dtype bf16 --shape 2,8,2,64,100,16 --huge-pages off)
check_rows("--huge-pages off" 2 "^(cpu|naive),bf16,2,8,2,64,100,16,.*,hnd,bf16,0\\.0$")
if(NOT err MATCHES "huge pages: off for the K/V pools \\(transparent huge pages: [a-z]+\\)")
  message(FATAL_ERROR "--huge-pages off: no huge pages line in:\n${err}")
endif()
set(header_tail ",compute_gbps,pattern_gbps,pct_bound,bound,pattern_huge_gbps")
run_bench("--huge-pages on --limits" --dtype f32 --shape 1,4,4,128,37,8 --huge-pages on --limits)
unset(header_tail)
check_rows("--huge-pages on --limits" 2
           "^(cpu,f32,.*,(read|compute),${num}|naive,f32,.*,,,,,),(100\\.0|[0-9]?[0-9]\\.[0-9])$")

# MLA decode (--mla): its own CSV, every row within its dtype's tolerance (the exit status), with
# one and three query tokens per sequence and an fp8 cache.
foreach(extra "" "--q-len 3" "--kv-dtype fp8_e4m3 --dtype f32")
  separate_arguments(extra_args UNIX_COMMAND "${extra}")
  execute_process(COMMAND ${BENCH} ${quick} --mla --shape 2,16,1,576,70,16 ${extra_args}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pagedattn-bench --mla ${extra} exited with ${rc}:\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "^backend,dtype,kv_dtype,batch,heads,context,block_size,q_len,ms,gbps,pct_read_bw,rel_err,batch_invariant\ncpu,(bf16|f32),(bf16|fp8_e4m3),2,16,70,16,[13],${num},${num},${num},${num},0\n$")
    message(FATAL_ERROR "unexpected --mla ${extra} output:\n${out}")
  endif()
endforeach()

# --share: every shape timed without sharing (cpu) and with it (shared), both within tolerance,
# then the naive row, and a line with the speed-up and the bytes each reads; with query tokens and
# a window too. PREFIX past a context is refused naming the flag.
run_bench("--share 4,60" --dtype bf16 --shape 8,8,2,64,100,16 --share 4,60)
check_rows("--share 4,60" 3 "^(cpu|shared|naive),bf16,8,8,2,64,100,16,")
if(NOT err MATCHES "sharing 4-sample prefixes of 60 tokens: [0-9.]+x faster; K/V read per step")
  message(FATAL_ERROR "--share: no sharing line in:\n${err}")
endif()
run_bench("--share 3,50 --q-len 3 --window 80" --dtype f32 --shape 6,8,2,64,90,8 --share 3,50
          --q-len 3 --window 80 --no-naive)
check_rows("--share 3,50 --q-len 3 --window 80" 2 "^(cpu|shared),f32,6,8,2,64,90,8,")
execute_process(COMMAND ${BENCH} ${quick} --shape 4,8,2,64,40 --share 2,41
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--share = '2,41'")
  message(FATAL_ERROR "--share past the context: exit status ${rc}, expected 2 and a message "
                      "naming the flag:\n${err}")
endif()
