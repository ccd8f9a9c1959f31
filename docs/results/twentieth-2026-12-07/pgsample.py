import os, time, sys, json
# samples CPU ticks of every postgres process each second: out file lines of json
out=open(sys.argv[1],'w'); dur=float(sys.argv[2])
end=time.time()+dur
while time.time()<end:
    snap={}
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            comm=open(f'/proc/{pid}/comm').read().strip()
            if comm not in ('postgres','postmaster'): 
                cmd=open(f'/proc/{pid}/cmdline').read().replace('\0',' ')
                if not cmd.startswith('postgres'): continue
            cmd=open(f'/proc/{pid}/cmdline').read().replace('\0',' ').strip()
            st=open(f'/proc/{pid}/stat').read().rsplit(')',1)[1].split()
            snap[pid]=(cmd,int(st[11])+int(st[12]))
        except Exception: pass
    out.write(json.dumps({"t":time.time(),"p":snap})+"\n"); out.flush()
    time.sleep(1)
