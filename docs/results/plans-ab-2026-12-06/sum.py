import json,sys,glob,os
d=sys.argv[1]
rows=[]
for f in sorted(glob.glob(d+'/*.json')):
    j=json.load(open(f))
    for b in j['benchmarks']:
        for ph,v in b.get('figures',{}).items():
            if not isinstance(v,dict) or 'latency_201_to_arrival' not in v: continue
            l=v['latency_201_to_arrival']
            cpu=v.get('cpu_cores',{})
            print(f"{os.path.basename(f)[:-5]:8} {ph:28} offered {(v.get('offered_per_s') or 0):6.0f} deliv/s {(v.get('deliveries_per_s') or 0):7.1f} p50 {l['p50_ms']:7.2f} p99 {l['p99_ms']:8.2f} max {l['max_ms']:8.1f} pgcpu/d {(v.get('postgres_cpu_ms_per_delivery') or 0):6.3f} wal/d {(v.get('wal_bytes_per_delivery') or 0):6.0f} pg {(cpu.get('postgres') or 0):.2f} all {sum(x for x in cpu.values() if x):.2f}")
