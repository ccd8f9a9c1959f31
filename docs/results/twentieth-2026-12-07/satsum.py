import json,sys,glob,os
for f in sorted(glob.glob(sys.argv[1]+"/*.json"), key=lambda x:(x.split('-')[-1],x)):
    d=json.load(open(f)); e=[b for b in d["benchmarks"] if b["name"]=="e2e"][0]; F=e["figures"]
    steps=" ".join(f'{s["offered_per_s"]:.0f}:{s["deliveries_per_s"]:.0f}/p99 {s["latency_201_to_arrival"]["p99_ms"]:.0f}/busy {sum(s["worker"]["claims_busy"].values()):.0f}{"" if s["sustained"] else "X"}' for s in F["steps"])
    h=F["half_saturation"]; l=F["light_200_per_s"]
    print(os.path.basename(f), "sat", round(F["sustained_deliveries_per_s"]), "half p99", round(h["latency_201_to_arrival"]["p99_ms"]), "light", round(l["latency_201_to_arrival"]["p50_ms"],2), round(l["latency_201_to_arrival"]["p99_ms"],2))
    print("   ", steps)
