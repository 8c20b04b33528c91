"""Reading a kernel's CUDA prelude (kernel_src.cuda.prelude) in tests."""

import re


def expand_defines(text: str) -> str:
    """The prelude as the compiler reads it: each `#define NAME value` line removed and NAME replaced by its value."""
    defines = dict(re.findall(r'^#define (\w+) (.*)$', text, re.MULTILINE))
    text = re.sub(r'^#define .*\n', '', text, flags=re.MULTILINE)
    if not defines:
        return text
    return re.sub(r'\b(' + '|'.join(defines) + r')\b', lambda m: defines[m.group(1)], text)
