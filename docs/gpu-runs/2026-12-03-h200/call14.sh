#!/usr/bin/env bash
# Run 4 of the thirty-first session: Nsight Compute counters of the cases below or at 75% of copy on the landed wheels
# (the per-channel SwiGLU cast and the per-row bf16 SwiGLU forward, with and without values beyond the clamp; the bf16
# e2m1 per_token_cast of inputs that are not 16-byte aligned).
set -u
O=$1
OUT=$O/ncu DIST=dist-land31 NCU_SELECT='quant.swiglu_forward_and_per_channel_cast_and_transpose:"transpose":false,"vec_bytes":16 quant.swiglu_forward_and_per_token_cast:"in_dtype":"bfloat16","per_row":true quant.per_token_cast:"aligned":false,"fmt":"e2m1","in_dtype":"bfloat16"' bash .ci/gpu-session.sh ncu > $O/session.txt 2>&1
echo "session rc $?"
python3 -m benchmarks.ncu_profile --table $O/ncu/ncu.log | tee $O/ncu_table.md
cd $O && tar czf logs.tgz ncu session.txt && rm -rf ncu
