#!/usr/bin/env bash
# usage: [BUILDS=dir] [BASE=dir] [NEW=dir] ab.sh OUT ROUNDS PHASES...; two builds in $BUILDS/$BASE and $BUILDS/$NEW (BUILDS=/tmp/s16 by default; the seventeenth session's A/Bs ran with BUILDS=/tmp/s17) (railhook and railhook-bench each: the bench's build migrates the database), alternated, the order flipped every round. BASE=base NEW=new by default (main against the claim fast path); BASE=new NEW=new2 was the finalise A/B.
set -u
out=$1; rounds=$2; shift 2
mkdir -p "$out"
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
P=(psql -X -q -h 127.0.0.1 -p 54329 -U postgres -d postgres -tA)
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do bdir=${b/base/${BASE:-base}}; bdir=${bdir/new/${NEW:-new}};
    "${P[@]}" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'rh_slot_%' AND NOT active" >/dev/null
    for db in $("${P[@]}" -c "SELECT datname FROM pg_database d WHERE datname LIKE 'rh\_test\_%' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.database = d.datname AND s.active)"); do "${P[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null; done
    echo "$(date +%T) round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    "${P[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null
    ${BUILDS:-/tmp/s16}/$bdir/railhook-bench --bin ${BUILDS:-/tmp/s16}/$bdir/railhook --duration 20 --out "$out/$b-$r.json" "$@" > "$out/$b-$r.txt" 2>&1
    "${P[@]}" -c "COPY (SELECT calls, round(total_exec_time::numeric,1) AS ms, rows, toplevel, left(regexp_replace(query,'\s+',' ','g'),100) FROM pg_stat_statements WHERE toplevel ORDER BY total_exec_time DESC LIMIT 8) TO STDOUT WITH CSV" > "$out/$b-$r.pgss.csv"
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
