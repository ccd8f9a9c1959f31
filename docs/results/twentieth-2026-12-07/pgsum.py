import json,sys,collections,re
lines=[json.loads(l) for l in open(sys.argv[1])]
t0=float(sys.argv[2]); t1=float(sys.argv[3])  # seconds offsets from start
start=lines[0]["t"]
a=min(lines,key=lambda l:abs(l["t"]-start-t0)); b=min(lines,key=lambda l:abs(l["t"]-start-t1))
dt=b["t"]-a["t"]; agg=collections.Counter()
for pid,(cmd,ticks) in b["p"].items():
    prev=a["p"].get(pid,(cmd,0))[1] if pid in a["p"] else 0
    key=re.sub(r'\d+\.\d+\.\d+\.\d+\(\d+\)','',cmd)
    key=re.sub(r'postgres: \S+ ','',key)
    agg[key.strip()[:60]]+= (ticks-prev)/100/dt
for k,v in agg.most_common(25): print(f"{v:6.3f} {k}")
print("total", round(sum(agg.values()),3))
