"""THE Markdown table writer (pure)."""
from __future__ import annotations

import pytest

from hardpos import markdown


def test_table_writes_escapes_and_checks_widths():
    assert markdown.table(["a", "b"], [[1, None], ["x|y", 0.5]]) == "| a | b |\n|---|---|\n| 1 |  |\n| x\\|y | 0.5 |"
    with pytest.raises(ValueError, match="row 0 has 1 cells, the header 2"):
        markdown.table(["a", "b"], [[1]])
