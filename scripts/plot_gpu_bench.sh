#!/bin/sh
# Plots one GPU job's results: % of the read ceiling per anchor shape for the CUDA backend
# (pagedattn-bench --csv, bf16, block 16), for FlashInfer's faster decode path (its benchmark's
# CSV) and for the seed's best split kernel (the gpu_anchors CSV), all measured in the same job,
# with the 95% target as a line.
#
#   scripts/plot_gpu_bench.sh docs/perf/gpu_bench_a1ef89e.csv docs/perf/gpu_anchors_graph_a1ef89e.csv \
#       docs/perf/gpu_flashinfer_a1ef89e.csv docs/perf_gpu.png
#
# Needs gnuplot without X (Debian package gnuplot-nox: apt-get install gnuplot-nox).
set -eu
usage="usage: plot_gpu_bench.sh BENCH.csv ANCHORS.csv FLASHINFER.csv OUT.png"
bench=${1:?$usage}
anchors=${2:?$usage}
flashinfer=${3:?$usage}
png=${4:?$usage}
command -v gnuplot >/dev/null || { echo "gnuplot not found: apt-get install gnuplot-nox" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Rows: label, ours %, FlashInfer's faster path %, seed split best % ("-" where a tool did not
# run the shape). All are of the read ceiling pagedattn-bench measured (its gbps / pct): the GPU
# job passes it to the anchors (READ_CEILING_GBPS), and FlashInfer's GB/s count the same K+V bytes.
awk -F, '
  FNR == 1 { file++ }
  file == 1 && FNR > 1 && $1 == "cuda" && $2 == "bf16" && $8 == 16 {
    key = $3 "," $4 "," $5 "," $6 "," $7
    if (!(key in ours)) order[++n] = key
    ours[key] = $11
    ceiling = $10 / $11 * 100
  }
  file == 2 && $7 ~ /^seed_split/ {
    key = $1 "," $2 "," $3 "," $4 "," $5
    if (!(key in seed) || $10 + 0 > seed[key] + 0) seed[key] = $10
  }
  file == 3 && FNR > 1 && $1 ~ /^flashinfer/ {
    key = $3 "," $4 "," $5 "," $6 "," $7
    if (!(key in fi) || $11 + 0 > fi[key] + 0) fi[key] = $11
  }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]
      printf "\"%s\" %s %s %s\n", k, ours[k], (k in fi ? sprintf("%.1f", fi[k] / ceiling * 100) : "-"), (k in seed ? seed[k] : "-")
    }
  }' "$bench" "$anchors" "$flashinfer" > "$tmp/data.txt"

gnuplot <<GP
set terminal pngcairo size 1200,620 noenhanced font ",10"
set output "$png"
set title "pagedattn CUDA decode vs FlashInfer and the seed: % of the read ceiling (bf16, block 16, fragmented, graph replay, one job)"
set ylabel "% of the GPU read ceiling measured in the same job"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -25
set key outside below horizontal
set yrange [0:100]
set datafile missing "-"
plot "$tmp/data.txt" using 2:xtic(1) title "pagedattn cuda", \
     "" using 3 title "FlashInfer (faster of tensor-core and CUDA-core decode)", \
     "" using 4 title "seed split best", \
     95 with lines lw 2 lc rgb "black" title "95% target (KV >= 512 MB)"
GP
echo "wrote $png"
