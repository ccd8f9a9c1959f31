import json,sys,glob,re
for f in sorted(glob.glob(sys.argv[1]), key=lambda s:(int(re.findall(r'-(\d+)\.json',s)[0]), s)):
    d=json.load(open(f))
    for b in d['benchmarks']:
        for k,v in b.get('figures',{}).items():
            if not isinstance(v,dict) or 'latency_201_to_arrival' not in v: continue
            if k.startswith('ordered_') and k not in ('ordered_1000_per_s','ordered_burst'): continue
            l=v['latency_201_to_arrival']; w=v.get('worker',{})
            print(f"{f.split('/')[-1]:20s} {k:28s} p50 {l['p50_ms']:7.2f} p99 {l['p99_ms']:7.1f} max {l['max_ms']:7.1f} d/s {v['deliveries_per_s']:6.0f} acc/s {v.get('accepted_per_s',0):6.0f} held {v.get('api_ingest_held',0):5.0f} cb {w.get('mean_claim_batch',0):5.1f} pgms {v.get('postgres_cpu_ms_per_delivery',0):5.3f} tot {sum(v['cpu_cores'].values()):4.2f} met {v.get('targets_met')}")
