#!/usr/bin/env bash
# A/B of per_token_requant (dist-exp = 93bc67f vs dist-pair = paired halves, whole-sector loads), then the GPU tests
# and the sanitizers on dist-pair.
set -u
O=$1
OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 3 "tests/gpu/test_per_token_cast.py -k quantised" dist-exp dist-pair > $O/ab.txt 2>&1
tail -30 $O/ab.txt
OUT=$O/sess DIST=dist-pair SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests sanitize > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log
cd $O && tar czf logs.tgz ab sess ab.txt session.txt && rm -rf ab sess
