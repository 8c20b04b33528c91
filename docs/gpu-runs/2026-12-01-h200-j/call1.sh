#!/bin/bash
# Session 17, call 1: A/B of the pending variants over the quant kernels they touch, then the GPU tests of vPQ,
# then the half-chunk per_token_requant variants against vPQ with their requant tests.
s0=$(date +%s)
bash exp/v3.sh 'quant.[ps]*' vPQ tests/gpu 2 '' vC vP vQ vPQ; mv $OUT/vr.tgz $OUT/vr1.tgz
echo "part1 $(( $(date +%s)-s0 )) s"
bash exp/v3.sh 'quant.per_token_requant' vH4,vH2 'tests/gpu/test_per_token_cast.py -k quantised' 3 '' vPQ vH4 vH2; mv $OUT/vr.tgz $OUT/vr2.tgz
echo "part2 $(( $(date +%s)-s0 )) s"
tar xzf $OUT/vr1.tgz -O --wildcards '*tests-vPQ.log' | tail -3
tar xzf $OUT/vr2.tgz -O --wildcards '*tests-vH*.log' | tail -6
