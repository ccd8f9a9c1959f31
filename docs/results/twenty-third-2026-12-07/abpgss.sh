#!/bin/bash
# abpgss.sh FIRST LAST PHASE... : rounds FIRST..LAST, pg_stat_statements.track 'all' then 'top'
# (ALTER SYSTEM and a reload before each run), the given railhook-bench phases; reset after.
# Rounds 1-3 ran `abpgss.sh 1 3 ordered light`, rounds 4-6 `abpgss.sh 4 6 ordered`.
set -u
FIRST=$1; LAST=$2; shift 2
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
D=/work/main/target/release
PS() { su postgres -c "psql -h 127.0.0.1 -p 54329 -d postgres -Atc \"$1\"" >/dev/null; }
for r in $(seq $FIRST $LAST); do
  for side in all top; do
    PS "alter system set pg_stat_statements.track = '$side'"; PS "select pg_reload_conf()"; sleep 1
    $D/railhook-bench --bin $D/railhook --out /tmp/s23/ab/pgss-$side-$r.json "$@" > /tmp/s23/ab/pgss-$side-$r.txt 2>&1
    echo "$side $r rc $? $(date +%T)"
  done
done
PS "alter system reset pg_stat_statements.track"; PS "select pg_reload_conf()"
