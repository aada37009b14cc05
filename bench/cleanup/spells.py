#!/usr/bin/env python3
"""Where the slow claims of an alternating run fall: bench/cleanup/spells.py OUT_DIR [CLIENTS...]

Reads what bench/cleanup/alternating.sh keeps in OUT_DIR/raw (the pgbench logs, the windows and the disk
samples). A claim is slow when it took longer than the p99 of all claims without the sweep; a second is a
spell when at least a tenth of the claims scheduled in it were slow. Per side it prints how many seconds were
spells, what share of the slow claims fell in them, and the disk's ms per write completed inside and outside
them: a spell with the disk slower and no more writes is the storage, not the claims' own work.
"""
import glob
import math
import os
import sys


def percentile(values, fraction):
    values = sorted(values)
    return values[max(0, math.ceil(len(values) * fraction) - 1)] if values else 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    raw = os.path.join(sys.argv[1], "raw")
    clients_list = sys.argv[2:] or ["1", "2"]
    guard = float(os.environ.get("CLEANUP_ALT_GUARD", "1"))
    disk = []  # (epoch, writes completed, ms writing)
    with open(os.path.join(raw, "disk")) as samples:
        for line in samples:
            fields = line.split()
            if len(fields) == 3:
                disk.append(tuple(float(x) for x in fields))
    print("| clients | side | seconds | spell seconds | slow claims | in spells | disk ms/write outside / in spells | disk writes/s outside / in spells |")
    print("|---|---|---|---|---|---|---|---|")
    for clients in clients_list:
        windows_file = os.path.join(raw, f"windows_c{clients}")
        if not os.path.exists(windows_file):
            continue
        # The first seconds of each window are left out, as alternating.sh does (CLEANUP_ALT_GUARD).
        windows = [(w[1], float(w[2]) + guard, float(w[3])) for w in (l.split() for l in open(windows_file))]
        claims = []  # (scheduled start, latency ms)
        for log in glob.glob(os.path.join(raw, f"alt_c{clients}.[0-9]*")):
            for line in open(log):
                f = line.split()
                end = int(f[4]) + int(f[5]) / 1e6
                claims.append((end - int(f[2]) / 1e6, int(f[2]) / 1e3))
        side_of = {}
        for side, start, end in windows:
            for second in range(math.ceil(start), math.floor(end)):
                side_of[second] = side
        per_second = {}
        for start, latency in claims:
            second = math.floor(start)
            if second in side_of:
                per_second.setdefault(second, []).append(latency)
        threshold = percentile([l for s, ls in per_second.items() if side_of[s] == "off" for l in ls], 0.99)
        disk_per_second = {}
        for (t0, w0, m0), (t1, w1, m1) in zip(disk, disk[1:]):
            acc = disk_per_second.setdefault(math.floor(t1), [0.0, 0.0])
            acc[0] += w1 - w0
            acc[1] += m1 - m0
        for side in ("off", "on"):
            seconds = [s for s in per_second if side_of[s] == side]
            slow = {s: sum(1 for l in per_second[s] if l > threshold) for s in seconds}
            spells = {s for s in seconds if slow[s] >= 0.1 * len(per_second[s])}
            total_slow = sum(slow.values())
            in_spells = sum(slow[s] for s in spells)

            def disk_of(chosen):
                writes = sum(disk_per_second.get(s, [0, 0])[0] for s in chosen)
                ms = sum(disk_per_second.get(s, [0, 0])[1] for s in chosen)
                return (ms / writes if writes else 0.0), (writes / len(chosen) if chosen else 0.0)

            outside = disk_of([s for s in seconds if s not in spells])
            inside = disk_of(spells)
            print(f"| {clients} | {'with the sweep' if side == 'on' else 'without'} | {len(seconds)} | {len(spells)} | "
                  f"{total_slow} (over {threshold:.3f} ms) | {100 * in_spells / max(total_slow, 1):.0f} % | "
                  f"{outside[0]:.3f} / {inside[0]:.3f} | {outside[1]:.0f} / {inside[1]:.0f} |")


if __name__ == "__main__":
    main()
