#!/bin/bash
# exp/rq.sh v1 v2 ...: exp/requant_f32.py over each dist-$v (dist for "new"), alternating twice; into $OUT/rq.tgz
W=/tmp/rq; rm -rf $W /tmp/tk-work; mkdir -p $W /tmp/tk-work; cp -r tests benchmarks exp pyproject.toml /tmp/tk-work/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
for v in "$@"; do d=dist-$v; [ $v = new ] && d=dist; rm -rf /tmp/site-$v
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$v $d/tile_kernels_aot_runtime*.whl $d/tile_kernels_aot_sm90a*.whl; done
for r in 1 2; do for v in "$@"; do
  (cd /tmp/tk-work && PYTHONPATH=/tmp/site-$v timeout 120 python3 -m exp.requant_f32) > $W/$r-$v.log 2>&1
done; done
tar czf $OUT/rq.tgz -C /tmp rq
