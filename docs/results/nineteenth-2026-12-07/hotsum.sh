cd $1 && for f in *-[0-9].json; do python3 -c "
import json,sys;d=json.load(open('$f'));F=d['benchmarks'][0]['figures']
f=F['hot_endpoint'];l=f['latency_201_to_arrival'];g=F['hot_endpoint_700_per_s']['latency_201_to_arrival']
print('$f'.ljust(12), '%5.0f/s p50 %5.1f p99 %5.1f max %5.1f'%(f['deliveries_per_s'],l['p50_ms'],l['p99_ms'],l['max_ms']), 'held',int(f['api_ingest_held']), 'qpeak',int(f['worker_queue_waiting_peak']), 'first-s max',f['max_ms_by_second'][0], '| 700/s p99 %.1f'%g['p99_ms'])
"; done
