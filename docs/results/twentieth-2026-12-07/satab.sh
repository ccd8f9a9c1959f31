#!/usr/bin/env bash
# usage: satab.sh OUT ROUNDS "b1 b2" -- alternates builds /tmp/s20/<b>/railhook on the saturation search
out=$1; rounds=$2; builds=$3
mkdir -p $out; cd /work/main
P="postgres://postgres@127.0.0.1:54329/postgres"
for r in $(seq 1 $rounds); do for b in $builds; do
  for db in $(psql $P -Atc "select datname from pg_database where datname like 'rh_test_%' or datname like 'rh_bench%'"); do psql $P -qc "drop database if exists \"$db\" with (force)" >/dev/null 2>&1; done
  for s in $(psql $P -Atc "select slot_name from pg_replication_slots where not active"); do psql $P -qAtc "select pg_drop_replication_slot('$s')" >/dev/null 2>&1; done
  RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092 \
   /tmp/s20/railhook-bench --bin /tmp/s20/$b/railhook --no-clean-phases --duration 10 --start-rate 976 --max-rate 3000 --out $out/$b-$r.json e2e > $out/$b-$r.log 2>&1
  echo "$b-$r rc $? $(date +%T)" >> $out/progress
done; done
