#!/usr/bin/env bash
# usage: ab-gc.sh OUT ROUNDS PHASES... ; old: the broker on G1's defaults (-Xms256m -Xmx768m); new: scripts/infra's default (Kafka's own).
set -u
out=$1; rounds=$2; shift 2
mkdir -p "$out"
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
P=(psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA)
dir=${BINDIR:-/work/main/target/release}
cd /work/main
for r in $(seq 1 "$rounds"); do
  for b in old new; do
    scripts/infra down >/dev/null 2>&1
    if [ $b = old ]; then RAILHOOK_KAFKA_JVM_OPTS="-Xms256m -Xmx768m -XX:+UseG1GC" scripts/infra up >/dev/null 2>&1; else RAILHOOK_KAFKA_JVM_OPTS="${NEW_OPTS:--Xms1g -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15}" scripts/infra up >/dev/null 2>&1; fi
    "${P[@]}" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
    for db in $("${P[@]}" -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do "${P[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
    tr '\0' ' ' < /proc/$(cat .local/kafka/kafka.pid)/cmdline | grep -o -- "-Xm[sx][^ ]*\|-XX:[^ ]*" | tr '\n' ' ' > "$out/$b-$r.jvm"
    "$dir/railhook-bench" --bin "$dir/railhook" --duration 10 --out "$out/warm-$b-$r.json" light > "$out/warm-$b-$r.txt" 2>&1
    g0=$(wc -l < .local/kafka/gc.log)
    echo "$(date +%T) round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    "$dir/railhook-bench" --bin "$dir/railhook" --duration 20 --out "$out/$b-$r.json" "$@" > "$out/$b-$r.txt" 2>&1
    tail -n +$((g0+1)) .local/kafka/gc.log > "$out/$b-$r.gc.log"
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
