#!/usr/bin/env bash
# Run 2 of the thirty-first session: A/B dist-ratio5 / dist-nox1 / dist-fin (3 passes, the requant tests on each), then the
# session (tests, bench, sanitize, pip) on dist-fin.
set -u
O=$1
T="tests/gpu/test_per_token_cast.py::test_per_token_cast_e4m3_to_e2m1_ties_without_round_sf tests/gpu/test_per_token_cast.py::test_per_token_cast_of_quantised_input tests/gpu/test_per_token_cast.py::test_per_token_cast_of_quantised_input_with_extreme_scale_factors"
timeout 330 env OUT=$O/ab bash exp/ab.sh 'quant.per_token_requant' 3 "$T" dist-ratio5 dist-nox1 dist-fin > $O/ab.txt 2>&1
grep "tests:" $O/ab.txt; grep -A1 "fmt=e2m1 in_fmt=e4m3" $O/ab.txt | cut -c1-260
OUT=$O/sess DIST=dist-fin KERNELS='quant.per_token_requant' SANITIZE_KERNELS='quant.per_token_requant' bash .ci/gpu-session.sh tests bench sanitize pip > $O/session.txt 2>&1
echo "session rc $?"
tail -3 $O/sess/pytest.log; grep -E "SUMMARY|FAILED|ran" $O/sess/sanitize.log | tail -20; tail -1 $O/sess/pip_install.log
cd $O && tar czf logs.tgz ab ab.txt sess session.txt && rm -rf ab sess
