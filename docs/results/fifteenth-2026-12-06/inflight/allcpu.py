#!/usr/bin/env python3
# Every process's CPU (utime+stime) sampled twice a second until SIGTERM; totals per role.
import os, time, signal, collections
tck = os.sysconf('SC_CLK_TCK')
first = {}; last = {}; role = {}
def classify(cmd, comm):
    if cmd.startswith('postgres'):
        return 'postgres: walsender' if 'walsender' in cmd else ('postgres: backends' if cmd.startswith('postgres: railhook') or cmd.startswith('postgres: postgres') else 'postgres: other')
    if 'kafka.Kafka' in cmd: return 'kafka broker'
    if 'railhook-bench' in cmd: return 'railhook-bench'
    parts = cmd.split()
    if parts and parts[0].endswith('/railhook'):
        return 'railhook ' + (parts[1] if len(parts) > 1 else '')
    return 'other:' + comm
def sample():
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd = open(f'/proc/{pid}/cmdline','rb').read().replace(b'\0',b' ').decode(errors='replace').strip()
            st = open(f'/proc/{pid}/stat').read()
        except Exception: continue
        comm = st[st.find('(')+1:st.rfind(')')]
        f = st[st.rfind(')')+2:].split()
        t = (int(f[11]) + int(f[12])) / tck
        if pid not in first: first[pid] = t
        last[pid] = t; role[pid] = classify(cmd, comm)
done = False
def stop(*a):
    global done; done = True
signal.signal(signal.SIGTERM, stop); signal.signal(signal.SIGINT, stop)
t0 = time.time()
while not done:
    sample(); time.sleep(0.5)
sample()
tot = collections.Counter()
for pid in last: tot[role[pid]] += last[pid] - first[pid]
el = time.time() - t0
print(f'elapsed {el:.1f}s  total {sum(tot.values())/el:.2f} cores')
for r, v in tot.most_common(15): print(f'{v:8.2f}s  {v/el:5.2f} cores  {r}')
