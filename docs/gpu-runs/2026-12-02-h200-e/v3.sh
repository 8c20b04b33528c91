#!/bin/bash
# exp/v3.sh KERNELS TESTVARS TESTS ROUNDS SANVARS v1 v2 ...: ROUNDS alternating benchmark passes (no decode) of KERNELS
# over dist-$v, then pytest TESTS on each of TESTVARS and compute-sanitizer on each of SANVARS; all into $OUT/vr.tgz
K=$1; TV=$2; TS=$3; R=$4; SV=$5; shift 5
W=/tmp/vr; rm -rf $W /tmp/tk-work; mkdir -p $W /tmp/tk-work; cp -r tests benchmarks pyproject.toml /tmp/tk-work/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
for v in "$@"; do rm -rf /tmp/site-$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$v dist-$v/tile_kernels_aot_runtime*.whl dist-$v/tile_kernels_aot_sm90a*.whl; done
for r in $(seq $R); do for v in "$@"; do
  s=$(date +%s)
  (cd /tmp/tk-work && PYTHONPATH=/tmp/site-$v timeout 300 python3 -m benchmarks.run --kernels "$K") > $W/bench-$r-$v.log 2>&1
  echo "wall $(( $(date +%s) - s )) s" >> $W/bench-$r-$v.log
done; done
for t in ${TV//,/ }; do
  s=$(date +%s)
  (cd /tmp/tk-work && PYTHONPATH=/tmp/site-$t timeout 400 python3 -m pytest -q -m gpu $TS) > $W/tests-$t.log 2>&1
  echo "wall $(( $(date +%s) - s )) s" >> $W/tests-$t.log
done
for t in ${SV//,/ }; do
  mkdir -p $W/san-$t; OUT=$W/san-$t DIST=dist-$t SANITIZE_KERNELS="$K" bash .ci/gpu-session.sh sanitize > $W/san-$t/session.log 2>&1
done
rm -f $W/*/junit.xml; tar czf $OUT/vr.tgz -C /tmp vr
