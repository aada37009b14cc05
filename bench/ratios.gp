# Bar chart of the throughput ratios; called by report.pl with datafile, output and width set.
set terminal pngcairo size width,560 font "sans,10"
set output output
set datafile missing "-"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside top center horizontal
set ylabel "throughput ratio (median of per-round ratios)"
set yrange [0:*]
set grid ytics
set xtics rotate by -35 nomirror
set title "idempotency benchmark: ratios of transactions per second"
plot datafile using 2:xtic(1) title "extension/floor" lc rgb "#1f77b4", \
     '' using 3 title "extension/plpgsql" lc rgb "#2ca02c", \
     '' using 4 title "plpgsql/floor" lc rgb "#ff7f0e", \
     '' using 5 title "bare/floor" lc rgb "#7f7f7f", \
     1 with lines dt 2 lc rgb "black" notitle
