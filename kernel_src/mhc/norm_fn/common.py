"""What the pre-norm kernels share: the spec schema and its checks, the padded column count, TF32 rounding."""

from tilelang import language as T

from kernel_src.decl import param

MIX_COLUMNS = 32  # mhc3 = mhc * (mhc + 2) product columns, padded to one warp and to whole 8-wide MMA tiles
MAX_MHC = 4  # the largest mhc with mhc3 <= MIX_COLUMNS

MHC_PARAMS = (param('mhc', 'int', 'm'),)
GEMM_PARAMS = (param('mhc', 'int', 'm'), param('hidden', 'int', 'h'))


def mix_count(mhc: int) -> int:
    return mhc * (mhc + 2)


def check_mhc(mhc: int) -> None:
    if not 1 <= mhc <= MAX_MHC:
        raise ValueError(f'mhc must be in [1, {MAX_MHC}] (mhc * (mhc + 2) <= {MIX_COLUMNS} product columns), got {mhc}')


def check_width(mhc: int, hidden: int, block: int) -> None:
    check_mhc(mhc)
    if hidden < 1 or mhc * hidden % block:
        raise ValueError(f'mhc * hidden must be a positive multiple of {block} (the GEMM step along it), got {mhc} * {hidden}')


def mhc_specs():
    from kernel_src.models import mhc_mults

    for mhc in mhc_mults():
        if mhc <= MAX_MHC:
            yield dict(mhc=mhc)


def gemm_specs():
    from kernel_src.models import mhc_shapes

    for mhc, hidden in mhc_shapes():
        if mhc <= MAX_MHC:
            yield dict(mhc=mhc, hidden=hidden)


def round_to_tf32(value):
    """Upstream's round_to_tf32 in a kernel: 0x1000 added to the float32 bits, so that the TF32 MMA, which drops the low
    13 bits, sees the value rounded half away from zero."""
    return T.reinterpret(T.reinterpret(value, T.int32) + T.int32(0x1000), T.float32)
