#!/bin/bash
# A/B of the staged SwiGLU forward (dist-st) against dist-final, tests + sanitizer on st, ncu of st's bf16 kernels
set -x
bash exp/v3.sh 'quant.swiglu_forward_and_per_token_cast' st tests/gpu/test_swiglu.py 3 st final st
bash exp/ncu-pipes.sh dist-st 'quant.swiglu_forward_and_per_token_cast:"in_dtype":"bfloat16"' > $OUT/ncu.log 2>&1
tail -5 $OUT/ncu.log
tar tzf $OUT/vr.tgz | head -30
for f in /tmp/vr/bench-*; do echo "== $f"; grep -E "swiglu|copy" $f | head -12; done
tail -3 /tmp/vr/tests-st.log; tail -5 /tmp/vr/san-st/session.log
