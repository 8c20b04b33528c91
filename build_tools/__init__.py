"""Build-time tooling for tile-kernels-aot: lower kernels with tilelang, compile with nvcc, package wheels.

Needs tilelang, ninja and nvcc; no GPU. Entry point: ``python -m build_tools --arch sm90``.
"""
