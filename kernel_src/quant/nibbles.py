"""Four e2m1 codes (nibbles) at a time through a byte table: what per_block_cast_lossless (codes to e4m3
bytes) and per_token_requant (codes to the high bytes of halves) share.

A code's magnitude (its low 3 bits, 0..7) indexes an eight-byte table held in two words, which one byte
permute (PRMT, __byte_perm) reads for four codes at once; a second permute and a shift move the codes'
sign bits (bit 3 of each nibble) to bit 7 of their bytes, where they flip bit 7 of the looked-up byte: the
sign of an e4m3 byte and of a half's high byte alike, -0 included. Decoding tables leave bit 7 free (a
negative code is its magnitude's byte with the sign set); per_token_requant's per-chunk tables may have it
set (a negative scale), and then the input's sign flips it, as negating a product flips its sign.

The same lookup gives per_token_requant's e2m1 -> e2m1 re-encoding eight codes at a time
(e2m1_word_through_table), and the largest magnitude of a chunk's codes (largest_magnitude).

Its own module (not common.py), so that a change here re-lowers only its users.
"""

from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.quant.common import let

CODE_MAGNITUDES = 0x77777777  # the magnitude bits of eight nibbles
SIGN_BITS_EVEN = 0x00800080  # bit 7 of output bytes 0 and 2, fed from bit 3 of their input byte (shifted up by 4)
SIGN_BITS_ODD = 0x80008000  # bit 7 of output bytes 1 and 3, which is bit 7 of their input byte
CODE_SIGNS = 0x88888888  # the sign bits of eight nibbles
PRESENCE_LOW, PRESENCE_HIGH = 0x08040201, 0x80402010  # byte m of the pair is 1 << m


def byte_perm(low, high, selector):
    """__byte_perm (PRMT): byte i of the result is byte (selector >> 4 i) & 7 of the eight bytes [low, high]."""
    return T.call_extern('uint32', '__byte_perm', low, high, selector)


# PTX prmt.b32 as it is (kernel_src/cuda/prmt.cuh): __byte_perm clears bit 3 of each selector nibble first, one LOP3
# a lookup whose selector nvcc cannot prove clean, i.e. every selector shifted out of a code word. With the magnitudes
# masked once per word (word & CODE_MAGNITUDES, whose nibbles and their shifts have bit 3 clear), the lookups below take
# no mask of their own. A kernel using prmt() puts PRMT_PRELUDE in its prelude.
PRMT_PRELUDE = prelude('prmt.cuh')  # tk_prmt


def prmt(low, high, selector):
    """PRMT of PRMT_PRELUDE: byte i of the result is byte s & 7 of [low, high] for s = (selector >> 4 i) & 15, or
    with s & 8 that byte's bit 7 replicated; callers pass selectors whose nibbles have bit 3 clear."""
    return T.call_extern('uint32', 'tk_prmt', low, high, selector)


def table_word(byte_values) -> int:
    """The uint32 holding four table bytes, the first in the low byte."""
    return sum(b << (8 * i) for i, b in enumerate(byte_values))


def table_bytes_of_codes(word, magnitudes, table_low, table_high, half):
    """uint32 of the four table bytes (sign in bit 7) of the e2m1 codes in nibbles 4 * half .. 4 * half + 3
    of `word` (output byte i from nibble 4 * half + i), with `magnitudes` = word & CODE_MAGNITUDES and the
    table's bytes 0..3 in table_low, 4..7 in table_high."""
    selector = magnitudes >> T.Cast('uint32', 16 * half)  # __byte_perm reads the low 16 bits
    looked_up = byte_perm(table_low, table_high, selector)
    # Input bytes 2 * half and 2 * half + 1, each twice: [b, b, b', b'].
    doubled = byte_perm(word, T.uint32(0), T.Cast('uint32', 0x1100 + 0x2222 * half))
    return looked_up ^ ((doubled << T.uint32(4)) & T.uint32(SIGN_BITS_EVEN)) ^ (doubled & T.uint32(SIGN_BITS_ODD))


def e2m1_word_through_table(word, magnitudes, codes_low, codes_high):
    """uint32 of eight e2m1 codes: nibble i is table[magnitude of nibble i of `word`] with its sign bit
    flipped where nibble i is negative, for a table of eight codes (0..15) whose bytes 0..3 are codes_low
    and 4..7 codes_high (magnitudes = word & CODE_MAGNITUDES; needs PRMT_PRELUDE).

    Two lookups give the codes of nibbles 0-3 and 4-7 as bytes, c0 + c1 2^8 + c2 2^16 + c3 2^24; that plus itself
    shifted down four bits (one LEA.HI) has c0 + 16 c1 in byte 0 and c2 + 16 c3 in byte 2, no byte carrying, and one
    permute gathers those four bytes: six integer-pipe instructions for eight codes with the magnitudes' shift, which
    largest_magnitude shares, where four lookups (nibbles 0-3, 1-4, 4-7, 5-7) paired by multiply-adds take the integer
    pipe nine and the FMA pipe two. The same pairing as a multiply-high-add by a 2^28 ptxas cannot fold (IMAD.HI, on
    the FMA pipe) is slower than by LEA.HI."""
    pairs = [let('code_bytes', 'uint32', prmt(codes_low, codes_high, magnitudes >> T.uint32(16 * half)), lambda b: b + (b >> T.uint32(4)))
             for half in range(2)]
    return byte_perm(pairs[0], pairs[1], T.uint32(0x6420)) ^ (word & T.uint32(CODE_SIGNS))


def largest_magnitude(magnitude_words):
    """int32 0..7: the largest e2m1 magnitude among the nibbles of the given words (each word & CODE_MAGNITUDES;
    needs PRMT_PRELUDE): a byte with bit m set for each magnitude m present, by one lookup per four codes, then
    its top bit."""
    present = None
    for magnitudes in magnitude_words:
        for half in range(2):
            bits = prmt(T.uint32(PRESENCE_LOW), T.uint32(PRESENCE_HIGH), magnitudes >> T.uint32(16 * half))
            present = bits if present is None else present | bits
    top_bit = lambda byte: T.int32(31) - T.call_extern('int32', '__clz', T.Cast('int32', byte))  # noqa: E731
    return let('present', 'uint32', present, lambda p: let(
        'present_halves', 'uint32', p | (p >> T.uint32(16)), lambda h: top_bit((h | (h >> T.uint32(8))) & T.uint32(0xFF))))


CODE_BIT_2 = 0x44444444  # magnitude bit 2 of eight nibbles: set for 4, 5, 6 and 7
CODE_BITS_2_1 = 0x66666666  # magnitude bits 2 and 1: some set from 2 up


def halving_steps_of_largest(magnitude_words):
    """(steps, nonzero): (7 - L) / 2 (int32) for the largest magnitude L of the words' nibbles (each word &
    CODE_MAGNITUDES), and whether L >= 1, without L itself: L >= 2 and L >= 4 are bits of the words' OR, and L >= 6
    is a nibble with bits 2 and 1 both set (x & (x << 1) at bit 2). About half the instructions of largest_magnitude."""
    any_bits = magnitude_words[0]
    top_pairs = magnitude_words[0] & (magnitude_words[0] << T.uint32(1))
    for magnitudes in magnitude_words[1:]:
        any_bits = any_bits | magnitudes
        top_pairs = top_pairs | (magnitudes & (magnitudes << T.uint32(1)))
    at_least = lambda bits, mask: T.Cast('int32', (bits & T.uint32(mask)) != T.uint32(0))
    steps = 3 - at_least(any_bits, CODE_BITS_2_1) - at_least(any_bits, CODE_BIT_2) - at_least(top_pairs, CODE_BIT_2)
    return steps, any_bits != T.uint32(0)
