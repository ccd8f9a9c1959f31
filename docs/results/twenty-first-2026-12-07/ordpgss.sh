#!/bin/bash
# usage: ordpgss.sh OUTPREFIX [bench args]  -- resets pg_stat_statements when ordered_700 finishes, snapshots after ordered_1000
out=$1; shift
P="psql -h 127.0.0.1 -p 54329 -U postgres -q"
/work/main/target/release/railhook-bench --out $out.json "$@" ordered > $out.log 2>&1 &
b=$!
until grep -q "^ordered_700_per_s: stages" $out.log; do sleep 0.2; kill -0 $b || exit 1; done
$P -Atc "select pg_stat_statements_reset()" >/dev/null
until grep -q "^ordered_1000_per_s: stages" $out.log; do sleep 0.2; kill -0 $b || break; done
$P -c "select calls, round(total_exec_time::numeric,0) ms, round((total_exec_time/calls)::numeric,3) mean, rows, left(regexp_replace(query,'\s+',' ','g'),100) q from pg_stat_statements order by total_exec_time desc limit 22" > $out.pgss
wait $b
grep "^ordered_1000" $out.log
