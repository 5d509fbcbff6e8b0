"""No function in analysis/ is over 80 lines: the statistics read as named stages a reader can follow from the runs
to the Findings table (analysis/pipeline.py `_analyze_table` and the stages it names)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 80


def long_functions(folder: Path, most: int = MOST_LINES) -> list[str]:
    """'path:line name (n lines)' of every function or method under `folder`, nested ones too, longer than `most`
    lines from its `def` to its last line."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        defs = [node for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in sorted(defs, key=lambda d: d.lineno):
            n = node.end_lineno - node.lineno + 1
            if n > most:
                out.append(f"{path.relative_to(folder)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_in_analysis_is_over_80_lines():
    assert long_functions(ROOT / "analysis") == []


def _function(name: str, lines: int, indent: str = "", kind: str = "def") -> str:
    """A function of exactly `lines` lines, `def` line included."""
    return f"{indent}{kind} {name}():\n" + f"{indent}    x = 1\n" * (lines - 1) + "\n\n"


def test_the_length_check_names_a_long_function_a_long_method_and_a_long_nested_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    text = (_function("at_most", MOST_LINES) + _function("over", MOST_LINES + 1) + "class K:\n"
            + _function("over_method", MOST_LINES + 1, "    ", "async def") + "def outer():\n"
            + _function("over_nested", MOST_LINES + 1, "    "))
    (tmp_path / "pkg" / "m.py").write_text(text)
    line = {name: next(i for i, ln in enumerate(text.split("\n"), 1) if f" {name}()" in ln)
            for name in ("over", "over_method", "outer", "over_nested")}
    assert long_functions(tmp_path) == [f"pkg/m.py:{line['over']} over (81 lines)",
                                        f"pkg/m.py:{line['over_method']} over_method (81 lines)",
                                        f"pkg/m.py:{line['outer']} outer (82 lines)",
                                        f"pkg/m.py:{line['over_nested']} over_nested (81 lines)"]
