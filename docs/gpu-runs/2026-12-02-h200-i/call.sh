#!/usr/bin/env bash
# The calls of the twenty-eighth session's record: an A/B of per_token_requant between dist-vb (the vec_bytes specs)
# and variants of it, and with `session`, then the GPU tests, the per_token_requant sanitizers and the pip install on
# $DIST (dist-vb unless given). ab.sh is docs/gpu-runs/2026-12-02-h200-g/ab.sh, summary.py the one beside this file; both ran from exp/.
#   bash call.sh OUT "dist-vb dist-vbfl dist-vbpf" session     (run 1; run 6: DIST=dist-tbl, "dist-vb dist-tbl" session)
#   bash call.sh OUT "dist-vb dist-vbnc"                       (run 2; runs 4 and 5 with dist-vb3c, dist-vbpl)
set -u
O=$1; VARIANTS=$2
timeout 400 env OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 3 "tests/gpu/test_per_token_cast.py -k quantised" $VARIANTS > $O/ab.txt 2>&1
tail -40 $O/ab.txt
if [ "${3:-}" = session ]; then
  OUT=$O/sess DIST=${DIST:-dist-vb} SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests sanitize pip > $O/session.txt 2>&1
  echo "session rc $?"
  tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran|clean" $O/sess/sanitize.log | tail -20
fi
cd $O && tar czf logs.tgz ab ab.txt $([ "${3:-}" = session ] && echo sess session.txt) && rm -rf ab sess
