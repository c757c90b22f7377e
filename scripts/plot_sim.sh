#!/usr/bin/env bash
# Turns a pagedattn-sim timeline (--csv FILE) into a PNG: batch and queue, cache occupancy and
# fragmentation, and attention time and bandwidth per step.
#   scripts/plot_sim.sh sim.csv [out.png]
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 TIMELINE.csv [OUT.png]" >&2
  exit 2
fi
csv=$1
png=${2:-${csv%.csv}.png}
command -v gnuplot >/dev/null || { echo "$0: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 2; }
[[ -r $csv ]] || { echo "$0: cannot read $csv" >&2; exit 2; }
head -1 "$csv" | grep -q '^step,arrived,running,waiting' ||
  { echo "$0: $csv is not a pagedattn-sim timeline" >&2; exit 2; }

gnuplot <<GNUPLOT
set datafile separator ','
set terminal pngcairo size 1200,1000 font ',10' noenhanced
set output '$png'
set key outside right top
set grid
set xlabel 'step'
set multiplot layout 3,1 title 'pagedattn-sim: $(basename "$csv")'

set title 'sequences'
set ylabel 'sequences'
plot '$csv' using 'step':'running' title 'running' with lines lw 2, \
     '' using 'step':'waiting' title 'waiting' with lines lw 2, \
     '' using 'step':'finished' title 'finished' with lines

set title 'cache'
set ylabel 'fraction'
set yrange [0:1]
plot '$csv' using 'step':'occupancy' title 'occupancy' with lines lw 2, \
     '' using 'step':'fragmentation' title 'fragmentation' with lines lw 2
unset yrange

set title 'attention per step (all layers)'
set ylabel 'ms'
set y2label 'GB/s'
set y2tics
plot '$csv' using 'step':'decode_ms' title 'decode_ms' with lines axes x1y1, \
     '' using 'step':'attn_gbps' title 'attn_gbps' with lines axes x1y2
unset multiplot
GNUPLOT
echo "$png"
