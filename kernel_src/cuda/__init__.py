"""CUDA device helpers that kernels call through ``T.call_extern``, kept as real source files.

Each ``*.cuh`` beside this module holds a few ``__device__`` functions (mostly inline PTX that TileLang
cannot express). A kernel puts the ones it calls in front of its generated code with ``T.Kernel(...,
prelude=prelude(...))``; the text is inlined, so every lowered ``.cu`` in the wheels stays self-contained.

Constants that Python also uses (ranges, table offsets) are defined once in the kernel module and handed
to the header as macros: ``prelude('swiglu_div.cuh', TK_FAST_DIV_MAX='0x1.4p+6f')`` emits
``#define TK_FAST_DIV_MAX 0x1.4p+6f`` before the file's text. The build hashes these files with the
package (build_tools.build), so editing one re-lowers the kernels that import this module.
"""

from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).resolve().parent


@functools.cache
def _text(name: str) -> str:
    path = HERE / name
    if path.suffix != '.cuh' or path.parent != HERE or not path.is_file():
        raise ValueError(f'{name!r} is not a header of kernel_src/cuda')
    return path.read_text()


def prelude(*names: str, **defines: object) -> str:
    """The text of the named headers, in order, preceded by one ``#define NAME value`` per keyword."""
    lines = [f'#define {key} {value}\n' for key, value in defines.items()]
    return ''.join(lines) + ''.join(_text(name) for name in names)
