import sys, re, glob, os
d = sys.argv[1]
for f in sorted(glob.glob(os.path.join(d, '*-[0-9].txt'))):
    t = open(f).read(); name = os.path.basename(f)[:-4]
    out = []
    for ph, short in [('hot_endpoint','hot'), ('hot_endpoint_700_per_s','700'), ('light_clean_200_per_s','light')]:
        m = re.search(r'^%s: (\d+) of (\d+) Deliveries arrived, (\d+) deliveries/s, p99 ([\d.]+) ms' % ph, t, re.M)
        s = re.search(r'^%s: stages .*read_to_ack ([\d.]+)/([\d.]+)' % ph, t, re.M)
        r = re.search(r'^%s\s+\d+\s+\d+\s+\d+/\d+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)' % ph, t, re.M)
        if m: out.append(f"{short} {m.group(3)}/s p50 {r.group(1) if r else '?'} p99 {float(m.group(4)):.1f} max {r.group(3) if r else '?'} ack {s.group(1)}/{s.group(2)}" if s else f"{short} {m.group(3)}/s p99 {m.group(4)}")
    c = os.path.join(d, name + '.cpu.txt')
    cpu = ''
    if os.path.exists(c):
        ct = open(c).read()
        g = lambda k: (re.search(r'([\d.]+) cores\s+%s' % re.escape(k), ct) or [None, '?'])[1]
        cpu = f"| rh {g('railhook --config')} kafka {g('kafka broker')} pg {g('postgres: backends')}"
    print(f"{name:7}| " + " | ".join(out) + " " + cpu)
