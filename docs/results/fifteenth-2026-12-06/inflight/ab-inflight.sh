#!/usr/bin/env bash
# usage: ab-inflight.sh OUT ROUNDS PHASES... ; one binary: base = max.in.flight 5 (as built), new = RAILHOOK_EXP_MAX_IN_FLIGHT=${NEWVAL:-1}
set -u
out=$1; rounds=$2; shift 2
mkdir -p "$out"
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
P=(psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA)
dir=/tmp/s15/bin-exp
for r in $(seq 1 "$rounds"); do
  for b in ${ORDER:-base new}; do
    "${P[@]}" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
    for db in $("${P[@]}" -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do "${P[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
    echo "$(date +%T) round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    if [ $b = new ]; then export RAILHOOK_EXP_MAX_IN_FLIGHT=${NEWVAL:-1}; else unset RAILHOOK_EXP_MAX_IN_FLIGHT; fi
    /tmp/s15/allcpu.py > "$out/$b-$r.cpu.txt" & S=$!
    "$dir/railhook-bench" --bin "$dir/railhook" --duration 20 --out "$out/$b-$r.json" "$@" > "$out/$b-$r.txt" 2>&1
    kill $S; wait $S
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
