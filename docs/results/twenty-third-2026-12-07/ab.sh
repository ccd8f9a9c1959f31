#!/bin/bash
# ab.sh NAME ROUNDS PHASE -- alternate base (A) and variant (B: env in $VAR_ENV, binaries in $BDIR)
set -u
NAME=$1; ROUNDS=$2; shift 2
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
ADIR=${ADIR:-/tmp/s23/base}; BDIR=${BDIR:-/tmp/s23/base}
for r in $(seq 1 $ROUNDS); do
  for side in A B; do
    if [ $side = A ]; then D=$ADIR; E=""; else D=$BDIR; E="${VAR_ENV:-}"; fi
    env $E $D/railhook-bench --bin $D/railhook --out /tmp/s23/ab/$NAME-$side-$r.json "$@" > /tmp/s23/ab/$NAME-$side-$r.txt 2>&1
    echo "$side $r rc $?"
  done
done
