#!/usr/bin/env bash
# One device call: A/B of per_token_requant (dist-mask vs dist-final), then a GPU session on dist-final.
set -u
O=$1
OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 3 "tests/gpu/test_per_token_cast.py -k quantised" dist-mask dist-final > $O/ab.txt 2>&1
tail -30 $O/ab.txt
OUT=$O/sess DIST=dist-final KERNELS='quant.per_token_requant' SANITIZE_KERNELS='quant.per_token_requant' \
  bash .ci/gpu-session.sh tests bench upstream cold pip sanitize > $O/session.txt 2>&1
echo "session rc $?"
grep -E "passed|failed|error" $O/sess/pytest.log | tail -3
grep -A3 "per_token_requant" $O/sess/bench.log | head -40
tail -15 $O/sess/upstream.log; tail -8 $O/sess/sanitize.log; tail -3 $O/sess/pip_install.log; tail -4 $O/sess/cold_start.log
cd $O && tar czf logs.tgz ab sess ab.txt session.txt && rm -rf ab sess
