"""Manifold hyper-connection (mHC) kernels as raw forward and backward functions (tensors in, outputs
allocated or given): upstream TileKernels' ``tile_kernels.mhc`` functions. The autograd ops and composites are
in :mod:`tile_kernels_aot.modeling.mhc`."""
