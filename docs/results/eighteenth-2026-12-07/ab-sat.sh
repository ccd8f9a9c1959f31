#!/bin/bash
# Saturation steps (+25 % from 1,000/s, 15 s each), the builds in $BUILDS (default /tmp/s18) named in $ORDER
# (default "base new") alternated, the order reversed every other round; pg_stat_statements per run (the sixteenth
# session's runb.sh, run from the repository's root). ROUNDS (default 2).
B=${BUILDS:-/tmp/s18}
for r in $(seq 1 ${ROUNDS:-2}); do
  order=${ORDER:-base new}
  if [ $((r % 2)) = 0 ]; then order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for b in $order; do
    echo "$(date +%T) $b $r load $(cut -d' ' -f1-3 /proc/loadavg)"
    BIN=$B/$b STEPS=${STEPS:-6} docs/results/sixteenth-2026-12-06/runb.sh $B/sat-$b-$r --start-rate 1000 --max-rate 4000 --step 15 --duration 5 2>&1 | grep -v NOTICE | sed "s/^/$b $r: /" | cut -c1-150
    grep -h "railhook_finalise_batch\|INSERT INTO attempts\|railhook_claim_batch\|WITH who\|WITH input" $B/sat-$b-$r.pgss.csv | cut -d, -f1-5 | sed "s/^/   /"
  done
done
