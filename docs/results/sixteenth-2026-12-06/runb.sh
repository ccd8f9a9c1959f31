#!/bin/bash
# Saturation steps with pg_stat_statements reset before; snapshot after the steps.
cd /work/main
out=$1; shift
P="psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA"
$P -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
for db in $($P -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do $P -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
$P -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
$BIN/railhook-bench --bin $BIN/railhook "$@" e2e > $out.log 2>&1 &
bp=$!
$P -c "SELECT pg_stat_statements_reset()" >/dev/null
while kill -0 $bp 2>/dev/null; do
  n=$(grep -c "^e2e step" $out.log)
  if [ "$n" -ge "${STEPS:-2}" ] || grep -q "not sustained" $out.log; then break; fi
  sleep 1
done
$P -c "COPY (SELECT calls, round(total_exec_time::numeric,1) AS ms, round((total_exec_time/calls)::numeric,4) AS per_call, rows, toplevel, left(regexp_replace(query,'\s+',' ','g'),160) FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 60) TO STDOUT WITH CSV HEADER" > $out.pgss.csv
kill $bp; sleep 2; pkill -f "railhook-bench" ; pkill -f "target/release/railhook " ; pkill -f "$BIN/railhook --config" ; true
grep "^e2e step" $out.log
