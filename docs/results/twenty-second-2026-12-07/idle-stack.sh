#!/bin/bash
# Idle stack's Postgres cost: api, relay, worker on a fresh database, no load, for $2 s.
set -u
BIN=${1:-/tmp/s22/A/railhook}; SECS=${2:-20}
P="psql -h 127.0.0.1 -p 54329 -U postgres -qAt"
$P -c "drop database if exists rh_idle with (force)"; $P -c "create database rh_idle owner railhook"
$P -d rh_idle -c "select pg_drop_replication_slot('rh_idle_slot') from pg_replication_slots where slot_name='rh_idle_slot'" >/dev/null 2>&1
export RAILHOOK_DATABASE_URL=postgres://railhook@127.0.0.1:54329/rh_idle RAILHOOK_KAFKA_BROKERS=127.0.0.1:19092
export RAILHOOK_KAFKA__TOPIC_PREFIX=idle$RANDOM RAILHOOK_RELAY__SLOT_NAME=rh_idle_slot RAILHOOK_RELAY__PUBLICATION_NAME=rh_idle_pub
export RAILHOOK_API__LISTEN=127.0.0.1:18980 RAILHOOK_RELAY__OPS_LISTEN=127.0.0.1:18981 RAILHOOK_WORKER__OPS_LISTEN=127.0.0.1:18982 RAILHOOK_TELEMETRY__LOG_FILTER=warn
$BIN migrate >/tmp/s22/idle-migrate.log 2>&1 || { echo migrate failed; cat /tmp/s22/idle-migrate.log; exit 1; }
$BIN api > /tmp/s22/idle-api.log 2>&1 & A=$!
$BIN relay > /tmp/s22/idle-relay.log 2>&1 & R=$!
$BIN worker > /tmp/s22/idle-worker.log 2>&1 & W=$!
sleep 15
pgcpu() { for p in $(pgrep -x postgres); do awk '{print $14+$15}' /proc/$p/stat 2>/dev/null; done | awk '{s+=$1} END {print s}'; }
$P -d rh_idle -c "select pg_stat_statements_reset()" >/dev/null
c0=$(pgcpu); t0=$(date +%s.%N)
sleep $SECS
c1=$(pgcpu); t1=$(date +%s.%N)
echo "postgres cores while idle: $(echo "($c1-$c0)/100/($t1-$t0)" | bc -l | cut -c1-5)"
$P -d rh_idle -c "select calls, round(total_exec_time::numeric,1) ms, round((total_exec_time/calls)::numeric,3) per, left(regexp_replace(query,'\s+',' ','g'),110) from pg_stat_statements where dbid=(select oid from pg_database where datname='rh_idle') order by total_exec_time desc limit 25"
kill $A $R $W; wait
$P -c "drop database if exists rh_idle with (force)"
