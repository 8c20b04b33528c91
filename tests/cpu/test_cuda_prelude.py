"""kernel_src.cuda.prelude: the headers' text in order, after one #define per keyword; anything but a header of
kernel_src/cuda is refused. The quant kernels' preludes define every TK_ macro their headers use."""

from __future__ import annotations

import re
import struct

import pytest

from kernel_src.cuda import HERE, prelude
from kernel_src.quant.common import E2M1_SIGNED_PRELUDE, RCP_DIV_PRELUDE
from kernel_src.quant.nibbles import PRMT_PRELUDE
from kernel_src.quant.per_block_cast import _BF16X2_PRELUDE
from kernel_src.quant.per_channel_cast import _OPAQUE_VECTOR_PRELUDE
from kernel_src.quant.per_token_cast.flat import UNALIGNED_BF16_PRELUDE
from kernel_src.quant.per_token_requant.f16_lanes import E4M3_TO_E2M1_F16_PRELUDE, RATIO_DOWN, RATIO_NUDGE, RATIO_UP


def test_defines_come_first_then_the_headers_in_order():
    text = prelude('rcp_div.cuh', 'prmt.cuh', TK_ONE='1', TK_HEX=hex(255) + 'u')
    assert text.splitlines()[:2] == ['#define TK_ONE 1', '#define TK_HEX 0xffu']
    body = text.split('\n', 2)[2]
    assert body == (HERE / 'rcp_div.cuh').read_text() + (HERE / 'prmt.cuh').read_text()
    assert prelude() == ''


@pytest.mark.parametrize('name', ['missing.cuh', 'rcp_div.h', '__init__.py', '../quant/common.py', 'sub/prmt.cuh', '../cuda/prmt.cuh'])
def test_anything_but_a_header_of_the_package_is_refused(name):
    with pytest.raises(ValueError, match='not a header of kernel_src/cuda'):
        prelude(name)


@pytest.mark.parametrize('text', [RCP_DIV_PRELUDE, E2M1_SIGNED_PRELUDE, PRMT_PRELUDE, _BF16X2_PRELUDE, _OPAQUE_VECTOR_PRELUDE,
                                  UNALIGNED_BF16_PRELUDE, E4M3_TO_E2M1_F16_PRELUDE])
def test_every_tk_macro_a_prelude_uses_is_defined_in_it(text):
    defined = set(re.findall(r'^#define (TK_\w+) ', text, flags=re.MULTILINE))
    code = '\n'.join(re.sub(r'//.*', '', line) for line in text.splitlines() if not line.startswith('#define '))
    assert set(re.findall(r'\bTK_\w+', code)) <= defined
    assert '{' in code and '}' in code  # a header's functions, not an empty file


def test_the_ratio_constants_are_the_float32_bits_python_derives():
    def defined(name):
        return int(re.search(rf'^#define {name} (0x[0-9a-f]+)u$', E4M3_TO_E2M1_F16_PRELUDE, flags=re.MULTILINE).group(1), 16)

    def bits(value):
        return struct.unpack('<I', struct.pack('<f', value))[0]

    assert defined('TK_RATIO_UP_BITS') == bits(RATIO_UP)
    assert defined('TK_RATIO_DOWN_BITS') == bits(RATIO_DOWN)
    assert defined('TK_RATIO_DOUBLE_UP_BITS') == bits(2 * (1 + RATIO_NUDGE))
    assert defined('TK_RATIO_DOUBLE_DOWN_BITS') == bits(2 * (1 - RATIO_NUDGE))
