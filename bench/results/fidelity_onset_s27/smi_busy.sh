#!/usr/bin/env bash
# Issue 35, session 27: the SM clock and the SW power cap flag (0x4) in a grid part's nvidia-smi samples
# (every 100 ms through the live runs) while the board draws > 200 W (busy).
#   bash bench/results/fidelity_onset_s27/smi_busy.sh PART_DIR...
for d in "$@"; do
  f=$(ls "$d"/smi_*.csv.gz)
  zcat "$f" | awk -F', ' -v name="$(basename "$d")" 'NR>1 && $4+0 > 200 {n++; s+=$2; p+=$4; if ($6 ~ /4$/) cap++; if ($2+0 < 1965) low++}
    END {printf "%-24s busy samples %5d: mean SM clock %.1f MHz (%.1f%% under 1,980), mean power %.0f W, SW power cap %.0f%%, under 1,965 MHz %.0f%%\n",
         name, n, s/n, 100*(1-s/n/1980), p/n, 100*cap/n, 100*low/n}'
done
