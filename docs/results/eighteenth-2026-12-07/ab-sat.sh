#!/bin/bash
# Saturation steps, base and new alternated, pgss per run (the sixteenth session's runb.sh, run from the repository's root).
for r in 1 2; do
  if [ $r = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    echo "$(date +%T) $b $r load $(cut -d' ' -f1-3 /proc/loadavg)"
    BIN=${BUILDS:-/tmp/s18}/$b STEPS=${STEPS:-6} docs/results/sixteenth-2026-12-06/runb.sh ${BUILDS:-/tmp/s18}/sat-$b-$r --start-rate 1000 --max-rate 4000 --step 15 --duration 5 2>&1 | grep -v NOTICE | sed "s/^/$b $r: /" | cut -c1-150
    grep -h "railhook_finalise_batch\|INSERT INTO attempts\|railhook_claim_batch\|WITH who\|WITH input" ${BUILDS:-/tmp/s18}/sat-$b-$r.pgss.csv | cut -d, -f1-5 | sed "s/^/   /"
  done
done
