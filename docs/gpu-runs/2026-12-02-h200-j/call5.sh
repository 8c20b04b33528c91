#!/usr/bin/env bash
# Run 5 of the twenty-ninth session: A/B dist-x1all / dist-tbl (the reverse of run 4's order), then the session (tests, bench, sanitize, pip) on dist-x1all.
set -u
O=$1
timeout 300 env OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 3 none dist-x1all dist-tbl > $O/ab.txt 2>&1
grep -A1 "fmt=e2m1 in_fmt=e4m3" $O/ab.txt | cut -c1-200
OUT=$O/sess DIST=dist-x1all KERNELS='quant.per_token_requant' SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests bench sanitize pip > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log | tail -20; tail -1 $O/sess/pip_install.log
cd $O && tar czf logs.tgz ab ab.txt sess session.txt && rm -rf ab sess
