#!/bin/bash
# exp/pf.sh: the per-channel SwiGLU cast over s22f and PF with TK_PREFETCH_WAVES in 0 0.5 1 2, two rounds; tests on PF
K='quant.swiglu_forward_and_per_channel_cast_and_transpose'
W=/tmp/vr; rm -rf $W /tmp/tk-work; mkdir -p $W /tmp/tk-work; cp -r tests benchmarks pyproject.toml /tmp/tk-work/
for v in s22f PF; do rm -rf /tmp/site-$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$v dist-$v/tile_kernels_aot_runtime*.whl dist-$v/tile_kernels_aot_sm90a*.whl; done
for r in 1 2; do
  (cd /tmp/tk-work && PYTHONPATH=/tmp/site-s22f timeout 300 python3 -m benchmarks.run --kernels "$K") > $W/bench-$r-s22f.log 2>&1
  for w in 0 0.5 1 2; do (cd /tmp/tk-work && TK_PREFETCH_WAVES=$w PYTHONPATH=/tmp/site-PF timeout 300 python3 -m benchmarks.run --kernels "$K") > $W/bench-$r-PF$w.log 2>&1; done
done
(cd /tmp/tk-work && PYTHONPATH=/tmp/site-PF timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_swiglu.py -k per_channel) > $W/tests-PF.log 2>&1
(cd /tmp/tk-work && TK_PREFETCH_WAVES=0.3 PYTHONPATH=/tmp/site-PF timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_swiglu.py -k per_channel) > $W/tests-PF03.log 2>&1
tar czf $OUT/vr.tgz -C /tmp vr
