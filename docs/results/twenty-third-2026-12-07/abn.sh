#!/bin/bash
# abn.sh NAME ROUNDS "LABEL=ENV ..." ... -- PHASES ; rotates variants, each "LABEL:ENVSTRING"
set -u
NAME=$1; ROUNDS=$2; shift 2
VARS=(); while [ "$1" != "--" ]; do VARS+=("$1"); shift; done; shift
export RAILHOOK_TEST_PG_URL=postgres://railhook@127.0.0.1:54329/postgres RAILHOOK_TEST_KAFKA_BROKERS=127.0.0.1:19092
D=${BINDIR:-/tmp/s23/base}
for r in $(seq 1 $ROUNDS); do
  for v in "${VARS[@]}"; do
    L=${v%%:*}; E=${v#*:}
    env $E $D/railhook-bench --bin $D/railhook --out /tmp/s23/ab/$NAME-$L-$r.json "$@" > /tmp/s23/ab/$NAME-$L-$r.txt 2>&1
    echo "$L $r rc $? $(date +%T)"
  done
done
