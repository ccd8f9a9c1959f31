import json, sys, glob, os
d = sys.argv[1]
phases = None
for f in sorted(glob.glob(os.path.join(d, '*-[0-9].json')), key=lambda p: (int(p.rsplit('-',1)[1][:-5]), p)):
    j = json.load(open(f))
    figs = {}
    for b in j['benchmarks']:
        figs.update({k: v for k, v in b.get('figures', {}).items() if isinstance(v, dict) and 'deliveries_per_s' in v})
    if phases is None:
        phases = [p for p in figs]
    cells = []
    for p in phases:
        v = figs.get(p)
        if not v: cells.append(f"{p}: -"); continue
        lat = v.get('latency_201_to_arrival', {})
        cells.append(f"{p}: {v['deliveries_per_s']:.0f}/s p50 {lat.get('p50_ms',0):.1f} p99 {lat.get('p99_ms',0):.1f} pg {v.get('postgres_cpu_ms_per_delivery')} ms/D pgc {v.get('cpu_cores',{}).get('postgres')}")
    print(os.path.basename(f)[:-5].ljust(7), ' | '.join(cells))
