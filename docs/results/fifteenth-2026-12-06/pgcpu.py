#!/usr/bin/env python3
# Samples every postgres process's CPU (utime+stime) once a second until killed; prints per role.
import os, sys, time, signal, re, collections
tck = os.sysconf('SC_CLK_TCK')
first = {}; last = {}; role = {}
def sample():
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd = open(f'/proc/{pid}/cmdline','rb').read().replace(b'\0',b' ').decode(errors='replace').strip()
            if not cmd.startswith('postgres'): continue
            st = open(f'/proc/{pid}/stat').read()
        except Exception: continue
        f = st[st.rfind(')')+2:].split()
        t = (int(f[11]) + int(f[12])) / tck
        if pid not in first: first[pid] = t
        last[pid] = t
        r = cmd
        m = re.match(r'postgres: (\S+) (\S+) ', cmd + ' ')
        if 'walsender' in cmd: r = 'walsender'
        elif cmd.startswith('postgres: railhook'): r = 'backend'
        elif cmd.startswith('postgres: postgres'): r = 'backend(postgres)'
        else: r = cmd.replace('postgres: ','')[:30]
        role[pid] = r
done = False
def stop(*a):
    global done; done = True
signal.signal(signal.SIGTERM, stop); signal.signal(signal.SIGINT, stop)
t0 = time.time()
while not done:
    sample(); time.sleep(0.5)
sample()
tot = collections.Counter()
for pid in last:
    tot[role[pid]] += last[pid] - first.get(pid, 0) if pid in first else 0
el = time.time() - t0
print(f'elapsed {el:.1f}s')
for r, v in tot.most_common(): print(f'{v:8.2f}s  {v/el:5.2f} cores  {r}')
