# Runs pagedattn-bench on tiny shapes and checks the CSV it prints (format and accuracy only).
set(header_want "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,")
string(APPEND header_want "pct_read_bw,rel_err,window,soft_cap,alibi,sinks,q_len")
set(num "[0-9.eE+-]+")
foreach(dtype f32 bf16)
  execute_process(
    COMMAND ${BENCH} --csv --dtype ${dtype} --threads 2 --iters 2 --min-time 0 --bw-mib 64
            --shape 2,8,2,64,100,16 --shape 1,4,4,128,37,8
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pagedattn-bench --dtype ${dtype} exited with ${rc}:\n${out}\n${err}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(FILTER lines EXCLUDE REGEX "^$")
  list(GET lines 0 header)
  if(NOT header STREQUAL "${header_want}")
    message(FATAL_ERROR "unexpected CSV header: '${header}'")
  endif()
  list(LENGTH lines n)
  if(NOT n EQUAL 5)  # header + (cpu, naive) x 2 shapes
    message(FATAL_ERROR "expected 4 CSV rows, got:\n${out}")
  endif()
  foreach(i RANGE 1 4)
    list(GET lines ${i} row)
    if(NOT row MATCHES
       "^(cpu|naive),${dtype},[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,${num},${num},${num},${num},-1,0,0,0,1$")
      message(FATAL_ERROR "malformed CSV row: '${row}'")
    endif()
  endforeach()
  if(NOT err MATCHES "read bandwidth: ${num} GB/s")
    message(FATAL_ERROR "no read bandwidth line in:\n${err}")
  endif()
endforeach()

# A skewed batch (--long-first): sequence 0 holds 700 tokens, the others 40. The exit status
# carries the CPU backend's accuracy against the f64 reference on it.
execute_process(
  COMMAND ${BENCH} --csv --dtype bf16 --threads 2 --iters 2 --min-time 0 --bw-mib 64
          --shape 4,8,2,64,40,16 --long-first 700
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pagedattn-bench --long-first exited with ${rc}:\n${out}\n${err}")
endif()
string(REPLACE "\n" ";" lines "${out}")
list(FILTER lines EXCLUDE REGEX "^$")
list(LENGTH lines n)
if(NOT n EQUAL 3)  # header + cpu + naive
  message(FATAL_ERROR "expected 2 CSV rows for --long-first, got:\n${out}")
endif()
foreach(i RANGE 1 2)
  list(GET lines ${i} row)
  if(NOT row MATCHES "^(cpu|naive),bf16,4,8,2,64,40,16,")
    message(FATAL_ERROR "malformed --long-first row: '${row}'")
  endif()
endforeach()

# Every attention variant at once, on the CPU backend and the naive baseline: the exit status
# carries both against the f64 reference (the naive one fatal only as --backend naive, so it runs
# on its own too), and the variant columns say what was on.
foreach(backend cpu naive)
  execute_process(
    COMMAND ${BENCH} --csv --backend ${backend} --dtype bf16 --threads 2 --iters 2 --min-time 0
            --bw-mib 64 --shape 3,8,2,64,100,16 --window 37 --soft-cap 2.5 --alibi --sinks
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pagedattn-bench --backend ${backend} with every variant exited with "
                        "${rc}:\n${out}\n${err}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(FILTER lines EXCLUDE REGEX "^$")
  list(GET lines 0 header)
  if(NOT header STREQUAL "${header_want}")
    message(FATAL_ERROR "unexpected CSV header with the variants: '${header}'")
  endif()
  list(GET lines 1 row)
  if(NOT row MATCHES "^${backend},bf16,3,8,2,64,100,16,${num},${num},${num},${num},37,2.5,1,1,1$")
    message(FATAL_ERROR "malformed row with the variants: '${row}'")
  endif()
endforeach()

# Multi-token queries (--q-len): 4 query tokens per sequence, on the CPU backend and the naive
# baseline, plain and with a window and sinks, a context shorter than the query tokens among
# them (--long-first 2: sequence 0's first two tokens attend to nothing). The exit status carries
# both against the f64 reference, and the q_len column says 4.
foreach(backend cpu naive)
  foreach(extra "" "--window 9 --sinks" "--long-first 2")
    separate_arguments(extra_args UNIX_COMMAND "${extra}")
    execute_process(
      COMMAND ${BENCH} --csv --backend ${backend} --dtype bf16 --threads 2 --iters 2 --min-time 0
              --bw-mib 64 --shape 3,8,2,64,100,16 --q-len 4 ${extra_args}
      OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "pagedattn-bench --backend ${backend} --q-len 4 ${extra} exited with "
                          "${rc}:\n${out}\n${err}")
    endif()
    string(REPLACE "\n" ";" lines "${out}")
    list(FILTER lines EXCLUDE REGEX "^$")
    list(GET lines 0 header)
    if(NOT header STREQUAL "${header_want}")
      message(FATAL_ERROR "unexpected CSV header with --q-len: '${header}'")
    endif()
    list(GET lines 1 row)
    if(NOT row MATCHES "^${backend},bf16,3,8,2,64,100,16,${num},${num},${num},${num},-?[0-9]+,0,0,[01],4$")
      message(FATAL_ERROR "malformed row with --q-len 4 ${extra}: '${row}'")
    endif()
  endforeach()
endforeach()
