#!/usr/bin/env bash
# A/B of per_token_requant (dist-exp = 93bc67f against a variant), then the GPU tests and the sanitizers on the variant.
#   bash call2.sh OUT VARIANT PASSES     (run 3: dist-wt 4; run 5: dist-pair 3, from a copy with those values written in)
set -u
O=$1; V=$2; R=$3
OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' $R "tests/gpu/test_per_token_cast.py -k quantised" dist-exp $V > $O/ab.txt 2>&1
tail -30 $O/ab.txt
OUT=$O/sess DIST=$V SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests sanitize > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log
cd $O && tar czf logs.tgz ab sess ab.txt session.txt && rm -rf ab sess
