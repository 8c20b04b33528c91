"""What the quant ops share: dtype tables, argument checks that raise before anything is allocated or
launched, the scale-factor layouts upstream allocates, and the run-time index arithmetic of the kernels.

Every check takes the op's name first, so that its error names the op the user called.
"""

from __future__ import annotations

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._launch import MAX_GRID

QuantTensor = tuple[torch.Tensor, torch.Tensor]
IN_DTYPES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}  # high-precision inputs -> spec value
OUT_DTYPES = {'bf16': torch.bfloat16, 'fp32': torch.float32}  # cast_back's fmt -> output dtype
FORMATS = ('e4m3', 'e2m1')
VECTOR_BYTES = 16
# per_token_cast's flat kernel, per_block_cast and (on SM100) the per-channel SwiGLU cast, where the input's
# alignment allows (their VEC_BYTES, CH_VEC_BYTES)
WIDE_VECTOR_BYTES = 32
MAX_GRID_Y = MAX_GRID[1]
# The `mode` scalar of the casts that share one kernel between the plain cast, its sf-only variant and its
# precomputed-sf variant.
MODE_CAST, MODE_SF_ONLY, MODE_PRECOMPUTED = 0, 1, 2


def check_grid_y(op: str, count: int, per_cta: int, what: str) -> None:
    """A grid whose y counts CTAs of `per_cta` tokens or columns each (a constant of the kernel's manifest entry)
    holds at most MAX_GRID_Y of them: `count` past that is refused before anything is allocated."""
    if -(-count // per_cta) > MAX_GRID_Y:
        raise ValueError(f'{op}: {what} at most {MAX_GRID_Y * per_cta}, got {count}')


def not_built(op: str, what: str) -> NotImplementedError:
    return NotImplementedError(f'{op}: {what} is not built in this release of tile-kernels-aot')


def magic(divisor: int) -> tuple[int, int]:
    """(magic, shift) with (n * magic) >> shift == n // divisor for every 0 <= n < 2^31.

    With l = ceil(log2(divisor)), magic = ceil(2^(31 + l) / divisor) < 2^32 and its excess
    e = magic * divisor - 2^(31 + l) < divisor <= 2^l, so n * e < 2^(31 + l) and the error term never
    reaches the next integer; n * magic < 2^63 fits a signed 64-bit product.
    """
    shift = 31 + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


def align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix('torch.')


def sf_format(packed: bool) -> str:
    """The ``sf_format`` spec value of a scale-factor layout."""
    return 'ue8m0' if packed else 'f32'


def check_bool(op: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f'{op}: {name} must be a bool, got {type(value).__name__}')
    return value


def check_sf_flags(op: str, use_tma_aligned_col_major_sf: object, round_sf: object, use_packed_ue8m0: object) -> tuple[bool, bool, bool]:
    """The three scale-factor flags of the casts, each a bool: (col_major, round_sf, packed)."""
    return (check_bool(op, 'use_tma_aligned_col_major_sf', use_tma_aligned_col_major_sf), check_bool(op, 'round_sf', round_sf),
            check_bool(op, 'use_packed_ue8m0', use_packed_ue8m0))


def check_e4m3(op: str, fmt: object, why: str = '') -> None:
    """For the ops that only produce e4m3; ``why`` (with its leading space) says why."""
    if fmt != 'e4m3':
        raise ValueError(f"{op}: fmt must be 'e4m3'{why}, got {fmt!r}")


def check_out_fmt(op: str, fmt: object) -> torch.dtype:
    """The output dtype of a cast back: ``'bf16'`` or ``'fp32'``."""
    if fmt not in OUT_DTYPES:
        raise ValueError(f"{op}: fmt must be 'bf16' or 'fp32', got {fmt!r}")
    return OUT_DTYPES[fmt]


def check_int_pair(op: str, name: str, value: object, types: tuple[type, ...] = (tuple,)) -> tuple[int, int]:
    """A block size: a tuple (or one of ``types``) of two ints, bools refused."""
    if not (isinstance(value, types) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise TypeError(f'{op}: {name} must be a tuple of two ints, got {value!r}')
    return int(value[0]), int(value[1])


def unpack_quant(op: str, x: object) -> QuantTensor:
    """The ``(data, sf)`` of a quantised input."""
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f'{op}: x must be a (data, sf) tuple, got {type(x).__name__}')
    return x


def is_pow2(value: int) -> bool:
    """Whether an int is a positive power of two (block sizes the kernels take as shifts)."""
    return value > 0 and value & (value - 1) == 0


def check_cast_back_args(op: str, x: object, x_block_size: object, data_dtypes: tuple[torch.dtype, ...],
                         multiple: int, token_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(data, sf, n) of a cast back's ``x`` and ``x_block_size = (m, n)``, n a positive multiple of ``multiple``;
    m is 1, or with ``token_blocks`` any power of two (the kernels shift the token index)."""
    data, sf = unpack_quant(op, x)
    check_int_pair(op, 'x_block_size', x_block_size)
    _checks.tensor(op, 'data', data, ndim=2, dtypes=data_dtypes)
    _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32, torch.int32))
    num_per_tokens, num_per_channels = x_block_size
    if num_per_tokens != 1 and not token_blocks:
        raise not_built(op, f'x_block_size={x_block_size} (blocks of more than one token)')
    if not is_pow2(num_per_tokens):
        raise ValueError(f'{op}: x_block_size[0] must be a power of two, got {num_per_tokens}')
    if num_per_channels < multiple or num_per_channels % multiple:
        raise ValueError(f'{op}: x_block_size[1] must be a positive multiple of {multiple}, got {num_per_channels}')
    return data, sf, num_per_channels


def check_packed_ue8m0(op: str, packed: bool, col_major: bool, round_sf: bool = True) -> None:
    """Packed UE8M0 scale factors are column-major and hold powers of two only (pass ``round_sf=True`` where
    the op does not compute them)."""
    if packed and not col_major:
        raise ValueError(f'{op}: use_packed_ue8m0 needs use_tma_aligned_col_major_sf=True (packed UE8M0 is column-major)')
    if packed and not round_sf:
        raise ValueError(f'{op}: use_packed_ue8m0 needs round_sf=True (UE8M0 holds powers of two only)')


def vector_bytes(t: torch.Tensor) -> int:
    """The widest vector the 2-D ``t`` allows the casts that come in both widths: 32 bytes where its pointer and row
    stride are 32-byte aligned, else 16 (for a ``t`` the caller has found 16-byte aligned)."""
    return WIDE_VECTOR_BYTES if row_aligned(t, WIDE_VECTOR_BYTES) else VECTOR_BYTES


def row_aligned(t: torch.Tensor, alignment: int) -> bool:
    """Whether the data pointer and the row stride (in bytes) of a 2-D ``t`` are multiples of ``alignment``;
    the row stride of a single row is never used, so it does not count."""
    row_bytes = t.stride(0) * t.element_size() if t.shape[0] > 1 else 0
    return (t.data_ptr() | row_bytes) % alignment == 0


def check_input_sf(op: str, sf: torch.Tensor, num_rows: int, num_blocks: int, what: str) -> bool:
    """Check the scale factors of a quantised input, ``num_rows`` x ``num_blocks`` blocks (``what`` describes
    them for the error): float32 in any strides, or packed UE8M0 int32 words, 4 blocks each, column-major as
    the casts return them. Returns whether they are packed."""
    packed = sf.dtype == torch.int32
    expected = (num_rows, -(-num_blocks // 4) if packed else num_blocks)
    if tuple(sf.shape) != expected:
        raise ValueError(f'{op}: sf must have shape {expected} for {what}, got {tuple(sf.shape)}')
    if packed and num_rows > 1 and sf.stride(0) != 1:
        raise ValueError(f'{op}: a packed UE8M0 sf (int32) must be column-major (stride(0) == 1), got strides {sf.stride()}')
    return packed


def packed_sf_bytes(sf: torch.Tensor) -> torch.Tensor:
    """Packed UE8M0 words [rows, words] as the bytes the kernels read: word w of row r is bytes [4r, 4r + 4) of
    row w of the uint8 view."""
    words = sf.T if sf.T.stride(-1) == 1 else sf.T.contiguous()  # one row: any stride(0) will do
    return words.view(torch.uint8)


def alloc_sf(num_rows: int, num_blocks: int, col_major: bool, packed: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the op returns, what the kernel writes) for a [num_rows, num_blocks] grid of scale factors,
    allocated as upstream's alloc_scaling_factors: column-major layouts pad the row dim to 16 bytes (4
    float32 or 4 int32 words), and packed UE8M0 holds 4 blocks per int32 (the kernel writes its bytes: row w
    of the uint8 view is word w, bytes [4r, 4r + 4) of it are row r)."""
    if packed:  # allocated as int32 words, so that the returned tensor is a view of the allocation in its own dtype
        words = torch.empty((-(-num_blocks // 4), align(num_rows, 4)), dtype=torch.int32, device=device)
        return words[:, :num_rows].T, words.view(torch.uint8)[:, :num_rows * 4]
    if col_major:
        sf = torch.empty((num_blocks, align(num_rows, 4)), dtype=torch.float32, device=device)[:, :num_rows].T
        return sf, sf
    sf = torch.empty((num_rows, num_blocks), dtype=torch.float32, device=device)
    return sf, sf


def alloc_quant_out(num_tokens: int, hidden: int, fmt: str, device: torch.device) -> torch.Tensor:
    """The data of an e4m3 cast (float8_e4m3fn [num_tokens, hidden]) or e2m1 cast (int8 [num_tokens, hidden / 2],
    two codes per byte, the even column in the low nibble), contiguous."""
    if fmt == 'e2m1':
        return torch.empty((num_tokens, hidden // 2), dtype=torch.int8, device=device)
    return torch.empty((num_tokens, hidden), dtype=torch.float8_e4m3fn, device=device)
