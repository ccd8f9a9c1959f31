#!/bin/bash
# sample pg_stat_activity of client backends for N seconds, 20 Hz
n=${1:-200}
for i in $(seq 1 $n); do
psql -X -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA -F'|' -c "select state, coalesce(wait_event_type,'CPU'), coalesce(wait_event,'-'), left(regexp_replace(query,'\s+',' ','g'),40) from pg_stat_activity where backend_type='client backend' and state <> 'idle' and pid <> pg_backend_pid()"
sleep 0.05
done
