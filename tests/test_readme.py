"""Every ```python block of README.md runs as written, each in a fresh interpreter (so that nothing another test
imported, such as a submodule, helps it). Without a GPU each block must compile, every attribute it reads from a
module it imports must exist (tile_kernels_aot.torch after a plain `import tile_kernels_aot`, say), and a block that
never mentions CUDA runs; with a GPU (and the binaries built or installed) each block runs whole."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
_FENCE = re.compile(r'^```(\w*)[^\n]*\n(.*?)^```[ \t]*$', re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number of the code, code) of each ```python (or ```py) block."""
    return [(text.count('\n', 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) in ('python', 'py')]


def blocks() -> list:
    if not README.is_file():  # a copy of tests/ without the checkout, as on a GPU machine that installs wheels
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f'no README.md at {README}'), id='no-readme')]
    found = python_blocks(README.read_text())
    assert found, 'README.md has no ```python block'
    return [pytest.param(line, code, id=f'line{line}') for line, code in found]


def module_attributes(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(name, attribute chain, line) of each outermost `name.attr.attr...` read in the code."""
    chains, inner = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        attrs, value = [], node
        while isinstance(value, ast.Attribute):
            attrs.append(value.attr)
            inner.add(id(value))
            value = value.value
        if isinstance(value, ast.Name):
            chains.append((value.id, attrs[::-1], node.lineno))
    return chains


def missing_module_attributes(source: str, filename: str) -> list[str]:
    """Attributes the code reads from the modules it imports that those modules lack. Only the code's top-level
    import statements run; a chain is followed while it names modules (a function's attributes are the run's)."""
    tree = ast.parse(source, filename)
    namespace: dict = {}
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=imports, type_ignores=[]), filename, 'exec'), namespace)
    missing = []
    for name, attrs, line in module_attributes(tree):
        obj, path = namespace.get(name), name
        for attr in attrs:
            if not isinstance(obj, types.ModuleType):
                break
            if not hasattr(obj, attr):
                missing.append(f'{Path(filename).name} line {line}: {path}.{attr} does not exist')
                break
            obj, path = getattr(obj, attr), f'{path}.{attr}'
    return missing


def run_block(line: int, mode: str) -> None:
    """In the fresh interpreter: the block's code comes on stdin. 'check': the names it reads exist, and a block
    that never mentions CUDA runs; 'run': it runs whole and the GPU finishes its work."""
    code = sys.stdin.read()
    source = '\n' * (line - 1) + code  # a traceback's line numbers are the README's
    if mode == 'check':
        missing = missing_module_attributes(source, str(README))
        if missing:
            sys.exit('\n'.join(missing))
        if 'cuda' in code.lower():
            return
    exec(compile(source, str(README), 'exec'), {'__name__': '__main__'})
    if mode == 'run':
        import torch

        torch.cuda.synchronize()


def in_fresh_interpreter(line: int, code: str, mode: str) -> None:
    runner = f'import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.test_readme import run_block; run_block({line}, {mode!r})'
    result = subprocess.run([sys.executable, '-c', runner], input=code, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f'README.md block at line {line} failed ({mode}):\n{result.stdout[-4000:]}{result.stderr[-8000:]}', pytrace=False)


def test_python_blocks_are_found():
    text = 'text\n```python\nimport os\n```\n```bash\nls\n```\n```py\nx = 1\n```\n'
    assert python_blocks(text) == [(3, 'import os\n'), (9, 'x = 1\n')]


def test_missing_module_attributes_are_found():
    source = 'import os\nimport os.path as p\nos.path.join("a")\nos.nope.x\np.nope2(1).real\nos.getcwd().nope3\n'
    assert missing_module_attributes(source, '/x/README.md') == [
        'README.md line 4: os.nope does not exist', 'README.md line 5: p.nope2 does not exist']


@pytest.mark.parametrize('line, code', blocks())
def test_block_compiles_and_reads_existing_names(line, code):
    compile('\n' * (line - 1) + code, str(README), 'exec')
    in_fresh_interpreter(line, code, 'check')


@pytest.mark.gpu
@pytest.mark.parametrize('line, code', blocks())
def test_block_runs_on_the_gpu(line, code):
    in_fresh_interpreter(line, code, 'run')
