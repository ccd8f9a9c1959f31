#!/bin/bash
# e2e steps with perf over postgres during the second step
BIN=${BIN:-/tmp/s18/base}
out=$1; shift
P="psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA"
$P -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
for db in $($P -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do $P -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
$BIN/railhook-bench --bin $BIN/railhook "$@" e2e > $out.log 2>&1 &
bp=$!
while kill -0 $bp 2>/dev/null && [ "$(grep -c '^e2e step' $out.log)" -lt 1 ]; do sleep 0.5; done
sleep 3
perf record -F 499 -a -g -o $out.perf.data -- sleep 15 2>/dev/null >/dev/null
while kill -0 $bp 2>/dev/null && [ "$(grep -c '^e2e step' $out.log)" -lt 2 ]; do sleep 0.5; done
kill $bp; sleep 2; pkill -f "railhook-bench"; pkill -f "$BIN/railhook --config"; true
grep "^e2e step" $out.log | cut -c1-150
