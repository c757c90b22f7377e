#!/bin/sh
# Plots one GPU job's results: % of the read ceiling per anchor shape for the CUDA backend
# (pagedattn-bench --csv, bf16, block 16) and for the seed's best split kernel measured in the
# same job (the gpu_anchors CSV), with the 90% target as a line.
#
#   scripts/plot_gpu_bench.sh docs/perf/gpu_bench.csv docs/perf/gpu_anchors_graph.csv \
#       docs/perf_gpu.png
#
# Needs gnuplot without X (Debian package gnuplot-nox: apt-get install gnuplot-nox).
set -eu
usage="usage: plot_gpu_bench.sh BENCH.csv ANCHORS.csv OUT.png"
bench=${1:?$usage}
anchors=${2:?$usage}
png=${3:?$usage}
command -v gnuplot >/dev/null || { echo "gnuplot not found: apt-get install gnuplot-nox" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Rows: label, ours %, seed split best % ("-" when the seed did not run the shape). The
# percentages are of the ceiling each tool measured; the GPU job passes the benchmark's ceiling
# to the anchors (READ_CEILING_GBPS), so both are of the same figure.
awk -F, '
  FNR == 1 { file++ }
  file == 1 && FNR > 1 && $1 == "cuda" && $2 == "bf16" && $8 == 16 {
    key = $3 "," $4 "," $5 "," $6 "," $7
    if (!(key in ours)) order[++n] = key
    ours[key] = $11
  }
  file == 2 && $7 ~ /^seed_split/ {
    key = $1 "," $2 "," $3 "," $4 "," $5
    if (!(key in seed) || $10 + 0 > seed[key] + 0) seed[key] = $10
  }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]
      printf "\"%s\" %s %s\n", k, ours[k], (k in seed ? seed[k] : "-")
    }
  }' "$bench" "$anchors" > "$tmp/data.txt"

gnuplot <<GP
set terminal pngcairo size 1200,560 noenhanced font ",10"
set output "$png"
set title "pagedattn CUDA decode vs the seed's best split kernel: % of the read ceiling (bf16, block 16, fragmented, graph replay)"
set ylabel "% of the GPU read ceiling measured in the same job"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -25
set key top right
set yrange [0:100]
set datafile missing "-"
plot "$tmp/data.txt" using 2:xtic(1) title "pagedattn cuda", \
     "" using 3 title "seed split best", \
     90 with lines lw 2 lc rgb "black" title "90% target (KV >= 512 MB)"
GP
echo "wrote $png"
