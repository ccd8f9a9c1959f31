#!/bin/bash
for r in 1 2; do
  if [ $r = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do bd=${b/new/new2};
    echo "$(date +%T) $b $r load $(cut -d' ' -f1-3 /proc/loadavg)"
    BIN=/tmp/s16/$bd STEPS=6 /tmp/s16/pgss/runb.sh /tmp/s16/pgss/sat2-$b-$r --start-rate 1000 --max-rate 4000 --step 15 --duration 5 2>&1 | grep -v NOTICE | sed "s/^/$b $r: /" | cut -c1-200
    grep -h "railhook_claim_batch\|railhook_finalise_batch\|railhook_claimed\|WITH who" /tmp/s16/pgss/sat2-$b-$r.pgss.csv | grep ",t," | cut -d, -f1-4 | sed "s/^/   /"
  done
done
