#!/bin/sh
# Plots pagedattn-bench CSV output: KV GB/s of the CPU backend per shape and dtype, against the
# read bandwidth measured in the same run (a horizontal line), and the naive baseline.
#
#   scripts/plot_cpu_bench.sh docs/perf/cpu_bench.csv docs/perf/cpu_bench.png
#
# Needs gnuplot without X (Debian package gnuplot-nox: apt-get install gnuplot-nox).
set -eu
csv=${1:?usage: plot_cpu_bench.sh BENCH.csv OUT.png}
png=${2:?usage: plot_cpu_bench.sh BENCH.csv OUT.png}
command -v gnuplot >/dev/null || { echo "gnuplot not found: apt-get install gnuplot-nox" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One row per shape: label, then GB/s for cpu f32, f16, bf16 and naive bf16 ("-" when absent).
awk -F, 'NR > 1 && $1 != "" {
  key = $3 "," $4 "," $5 "," $6 "," $7
  if (!(key in seen)) { seen[key] = 1; order[++n] = key }
  val[$1 "/" $2 "/" key] = $10
  if ($11 > 0) { bw_sum += 100 * $10 / $11; bw_n++ }
}
END {
  for (i = 1; i <= n; i++) {
    k = order[i]
    printf "\"%s\"", k
    split("cpu/f32 cpu/f16 cpu/bf16 naive/bf16", cols, " ")
    for (c = 1; c <= 4; c++) {
      v = val[cols[c] "/" k]
      printf " %s", (v == "" ? "-" : v)
    }
    printf "\n"
  }
  printf "%.3f\n", (bw_n ? bw_sum / bw_n : 0) > "/dev/stderr"
}' "$csv" > "$tmp/data.txt" 2> "$tmp/bw.txt"
bw=$(cat "$tmp/bw.txt")

gnuplot <<GP
set terminal pngcairo size 1100,560 noenhanced font ",10"
set output "$png"
set title "pagedattn CPU decode: KV GB/s per shape (B,H,KV,D,CTX; block 16, fragmented)"
set ylabel "GB/s of K and V read"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -25
set key top right
set yrange [0:*]
set datafile missing "-"
plot "$tmp/data.txt" using 2:xtic(1) title "cpu f32", \
     "" using 3 title "cpu f16", \
     "" using 4 title "cpu bf16", \
     "" using 5 title "naive bf16", \
     $bw with lines lw 2 lc rgb "black" title sprintf("read bandwidth %.1f GB/s", $bw)
GP
echo "wrote $png (read bandwidth line at $bw GB/s)"
