"""The docstring examples and the README example run and print what they claim.

Oracle: the expected output written next to each example.
"""

import doctest
import re
import runpy
from pathlib import Path

import pytest

from lf_tokenize_action import _binning, _fast, _vocab

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("module", [_binning, _fast, _vocab])
def test_docstring_examples(module):
    """Every `>>>` example in the module docstrings gives its written output."""
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_readme_example_runs(tmp_path):
    """The first ```python block of the README runs without error (it asserts its own results)."""
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert block is not None
    script = tmp_path / "readme_example.py"
    script.write_text(block.group(1))
    runpy.run_path(str(script), run_name="__main__")
