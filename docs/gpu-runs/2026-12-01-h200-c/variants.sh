#!/bin/bash
# exp/variants.sh KERNELS TESTVAR TESTS v1 v2 ...: bench KERNELS for each dist-$v in turn, then TESTS on dist-$TESTVAR
K=$1; TV=$2; TS=$3; shift 3
base=$OUT; i=0
for v in "$@"; do
  i=$((i+1)); o=$base/$i-$v; mkdir -p $o
  OUT=$o DIST=dist-$v KERNELS="$K" bash .ci/gpu-session.sh bench > /dev/null 2>&1
  grep -E "^(#|quant|moe|transpose)" $o/bench.log > $base/$i-$v.txt; rm -rf $o
done
if [ "$TV" != none ]; then
  OUT=$base/tests DIST=dist-$TV TESTS="$TS" bash .ci/gpu-session.sh tests > /dev/null 2>&1
  tail -5 $base/tests/pytest.log > $base/tests-summary.txt; rm -rf $base/tests
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $base/env.txt
