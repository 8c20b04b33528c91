#!/usr/bin/env bash
# A/B of per_token_requant (dist-exp = 93bc67f vs dist-wt = warp tiles for e4m3 -> e2m1 UE8M0), then the GPU tests
# and the sanitizers on dist-wt.
set -u
O=$1
OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 4 "tests/gpu/test_per_token_cast.py -k quantised" dist-exp dist-wt > $O/ab.txt 2>&1
tail -30 $O/ab.txt
OUT=$O/sess DIST=dist-wt SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests sanitize > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log
cd $O && tar czf logs.tgz ab sess ab.txt session.txt && rm -rf ab sess
