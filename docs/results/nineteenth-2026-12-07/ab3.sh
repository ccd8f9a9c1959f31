#!/bin/bash
# usage: ab3.sh OUT ROUNDS "b1 b2 b3" PHASES... ; builds in /tmp/s19/<b>; order rotated each round
out=$1; rounds=$2; builds=($3); shift 3
mkdir -p "$out"
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
P=(psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA)
n=${#builds[@]}
for r in $(seq 1 "$rounds"); do
  for k in $(seq 0 $((n-1))); do b=${builds[$(( (k + r) % n ))]}
    "${P[@]}" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
    for db in $("${P[@]}" -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do "${P[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
    echo "$(date +%T) round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    /tmp/s19/$b/railhook-bench --bin /tmp/s19/$b/railhook --duration 20 --out "$out/$b-$r.json" "$@" > "$out/$b-$r.txt" 2>&1
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
