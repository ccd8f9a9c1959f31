#!/usr/bin/env python3
import sys, re, glob, os
d = sys.argv[1]
for f in sorted(glob.glob(os.path.join(d, '*-[0-9].txt'))):
    name = os.path.basename(f)[:-4]
    if name.startswith('warm'): continue
    t = open(f).read()
    rows = []
    for ph in ['hot_endpoint', 'hot_endpoint_700_per_s', 'hot_endpoint_pacing_off', 'hot_endpoint_700_per_s_pacing_off', 'fanout_10']:
        m = re.search(r'^%s: \d+ of \d+ Deliveries arrived, (\d+) deliveries/s, p99 ([\d.]+) ms' % re.escape(ph), t, re.M)
        s = re.search(r'^%s: stages .*read_to_ack ([\d.]+)/([\d.]+)' % re.escape(ph), t, re.M)
        if m:
            rows.append(f"{ph.replace('hot_endpoint','hot')}: {m.group(1)}/s p99 {float(m.group(2)):.0f} ack99 {float(s.group(2)):.0f}" if s else f"{ph}: {m.group(1)}/s p99 {m.group(2)}")
    g = open(os.path.join(d, name + '.gc.log')).read() if os.path.exists(os.path.join(d, name + '.gc.log')) else ''
    p = [float(x) for x in re.findall(r'Pause .* ([\d.]+)ms$', g, re.M)]
    gc = f"gc pauses {len(p)} max {max(p) if p else 0:.0f} sum {sum(p):.0f} ms"
    print(f"{name:6} | " + " | ".join(rows) + " | " + gc)
