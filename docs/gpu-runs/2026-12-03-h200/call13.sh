#!/usr/bin/env bash
# Run 3 of the thirty-first session: the SwiGLU forward benchmarks (unchanged cubins) in 3 alternating passes of two wheel
# sets, then the session (tests, per_token_requant bench, its sanitizers, pip) on the landed wheels dist-land31.
set -u
O=$1
timeout 330 env OUT=$O/ab bash exp/ab.sh 'quant.swiglu_forward*' 3 none dist-land31 dist-ratio5 > $O/ab.txt 2>&1
grep -B1 -A0 "dist-land31:" $O/ab.txt | cut -c1-230 | head -60
OUT=$O/sess DIST=dist-land31 KERNELS='quant.per_token_requant' SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests bench sanitize pip > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log | tail -20; tail -1 $O/sess/pip_install.log
cd $O && tar czf logs.tgz ab ab.txt sess session.txt && rm -rf ab sess
