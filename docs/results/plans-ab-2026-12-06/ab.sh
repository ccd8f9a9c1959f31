#!/usr/bin/env bash
# usage: ab.sh OUTDIR ROUNDS PHASES... ; builds: base (/tmp/base-target/release) and new (/tmp/s14/bin-cache)
set -u
out=$1; rounds=$2; shift 2
mkdir -p "$out"
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
P=(psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA)
for r in $(seq 1 "$rounds"); do
  for b in base new; do
    case $b in base) dir=${BASEDIR:-/tmp/base-target/release};; new) dir=${NEWDIR:-/tmp/s14/bin-cache};; esac
    "${P[@]}" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
    for db in $("${P[@]}" -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do "${P[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
    "${P[@]}" -c "select pg_stat_statements_reset()" >/dev/null
    echo "$(date +%T) round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    "$dir/railhook-bench" --bin "$dir/railhook" --duration 20 --out "$out/$b-$r.json" "$@" > "$out/$b-$r.txt" 2>&1
    psql -X -h 127.0.0.1 -p 54329 -U postgres -d postgres -c "select calls, plans, round(total_plan_time::numeric,0) plan_ms, round(total_exec_time::numeric,0) exec_ms, round((wal_bytes/1e6)::numeric,1) wal_mb, left(regexp_replace(query,'\s+',' ','g'),100) q from pg_stat_statements order by total_plan_time+total_exec_time desc limit 30" > "$out/$b-$r.pgss.txt"
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
