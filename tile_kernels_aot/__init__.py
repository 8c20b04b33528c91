"""tile-kernels-aot: TileKernels' ops from kernels compiled ahead of time, with no JIT at run time.

    import tile_kernels_aot
    idx = tile_kernels_aot.moe.topk_gate(scores, 8)

Importing loads neither the CUDA driver nor any binary; the first call of an op on a device picks the
installed arch package for that GPU (tile_kernels_aot_sm90a, ...) and loads the one cubin it needs.
"""

# Every public submodule, so that `import tile_kernels_aot` is enough to reach them (tile_kernels_aot.torch too).
from tile_kernels_aot import config, cubin, engram, errors, manifest, mhc, modeling, moe, quant, reference, targets, torch, transpose, version
from tile_kernels_aot.version import __version__
from tile_kernels_aot.config import get_device_num_sms, get_num_sms, set_num_sms
from tile_kernels_aot._preload import preload

# Not 'torch': `from tile_kernels_aot import *` must not shadow the torch package.
__all__ = ['__version__', 'config', 'engram', 'errors', 'get_device_num_sms', 'get_num_sms', 'mhc', 'modeling', 'moe', 'preload', 'quant', 'reference', 'set_num_sms', 'transpose']
