"""Four e2m1 codes (nibbles) at a time through a byte table: what per_block_cast_lossless (codes to e4m3
bytes) and per_token_requant (codes to the high bytes of halves) share.

A code's magnitude (its low 3 bits, 0..7) indexes an eight-byte table held in two words, which one byte
permute (PRMT, __byte_perm) reads for four codes at once; a second permute and a shift move the codes'
sign bits (bit 3 of each nibble) to bit 7 of their bytes. So every table byte must leave bit 7 free
(at most 0x7F), and a negative code is its magnitude's byte with bit 7 set: the sign of an e4m3 byte and of
a half's high byte alike, -0 included.

Its own module (not common.py), so that a change here re-lowers only its users.
"""

from tilelang import language as T

CODE_MAGNITUDES = 0x77777777  # the magnitude bits of eight nibbles
SIGN_BITS_EVEN = 0x00800080  # bit 7 of output bytes 0 and 2, fed from bit 3 of their input byte (shifted up by 4)
SIGN_BITS_ODD = 0x80008000  # bit 7 of output bytes 1 and 3, which is bit 7 of their input byte


def table_word(byte_values) -> int:
    """The uint32 holding four table bytes, the first in the low byte."""
    return sum(b << (8 * i) for i, b in enumerate(byte_values))


def table_bytes_of_codes(word, magnitudes, table_low, table_high, half):
    """uint32 of the four table bytes (sign in bit 7) of the e2m1 codes in nibbles 4 * half .. 4 * half + 3
    of `word` (output byte i from nibble 4 * half + i), with `magnitudes` = word & CODE_MAGNITUDES and the
    table's bytes 0..3 in table_low, 4..7 in table_high."""
    selector = magnitudes >> T.Cast('uint32', 16 * half)  # __byte_perm reads the low 16 bits
    looked_up = T.call_extern('uint32', '__byte_perm', table_low, table_high, selector)
    # Input bytes 2 * half and 2 * half + 1, each twice: [b, b, b', b'].
    doubled = T.call_extern('uint32', '__byte_perm', word, T.uint32(0), T.Cast('uint32', 0x1100 + 0x2222 * half))
    return looked_up | ((doubled << T.uint32(4)) & T.uint32(SIGN_BITS_EVEN)) | (doubled & T.uint32(SIGN_BITS_ODD))
