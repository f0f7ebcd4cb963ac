#!/usr/bin/env python3
"""Summarize `ncu --csv --metrics gpu__time_duration.sum` output of graph-replayed decode steps
(bench/cuda/device_run.sh stages n8/n1): finds one full step (from one embedding kernel to the
next) and prints time per kernel name, the step's kernel-time total and kernel count."""
import csv, sys, re, collections

rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get('Metric Name') != 'gpu__time_duration.sum':
        continue
    v = float(r['Metric Value'].replace(',', ''))
    unit = r.get('Metric Unit', 'ns')
    us = v / 1000 if unit in ('nsecond', 'ns') else v if unit in ('usecond', 'us') else v * 1000
    name = re.sub(r'\(.*', '', r['Kernel Name'])
    rows.append((name, us, r.get('Grid Size', ''), r.get('Block Size', '')))
starts = [i for i, r in enumerate(rows) if r[0].startswith('k_embed')]
if len(starts) < 2:
    print('no complete step found;', len(rows), 'kernels'); sys.exit(1)
step = rows[starts[-2]:starts[-1]]
tot = sum(r[1] for r in step)
print(f'one decode step: {len(step)} kernels, {tot:.1f} us of kernel time')
agg = collections.OrderedDict()
for name, us, g, b in step:
    k = f'{name} grid{g} block{b}'
    a = agg.setdefault(k, [0, 0.0])
    a[0] += 1; a[1] += us
for k, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f'{us:9.1f} us {n:4d} x {us / n:7.2f} us  {k}')
