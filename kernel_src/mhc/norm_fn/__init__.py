"""The mHC pre-norm kernels: mixes = (x @ tf32(fn)^T) * rsqrt(mean(x^2) + eps) and their backward.

x is a token's residual streams flattened to width = mhc * hidden bf16 values; fn is the (mhc3, width) float32
projection, mhc3 = mhc * (mhc + 2). The forward runs two kernels: `gemm.FWD_MUL`, a split-K TF32 GEMM that
writes per-split partial products and sums of squares, and `norm.FWD_NORM`, which adds the partials in split
order and applies the RMS factor. The backward is `norm.BWD_NORM` (the gradients of the products and of the
sum of squares) then `gemm.BWD_MUL` (the residual gradient, accumulated into a bf16 buffer, and fn's). The
merge of fn with an RMS-norm weight and its backward are in `merge`.
"""
