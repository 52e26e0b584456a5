"""scripts/limits.py: the line bounds of product code, counted as it counts them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _limits() -> ModuleType:
    spec = importlib.util.spec_from_file_location("router_limits", REPO / "scripts" / "limits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


limits = _limits()

PYPROJECT = """
[tool.router-limits]
max-function-lines = 60
max-module-lines = 800
paths = ["app"]
exclude = ["*/tests/*"]
[tool.router-limits.function-exceptions]
{functions}
[tool.router-limits.module-exceptions]
{modules}
"""


def function(name: str, lines: int) -> str:
    """A function of exactly `lines` lines, `def` included."""
    return f"def {name}() -> None:\n" + "    pass\n" * (lines - 1)


def tree(tmp_path: Path, files: dict[str, str], functions: str = "", modules: str = "") -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.format(functions=functions, modules=modules))
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def breaches(root: Path) -> list[str]:
    found: list[str] = limits.breaches(root, limits.load(root))
    return found


def test_a_function_of_sixty_lines_passes_and_of_sixty_one_does_not(tmp_path: Path) -> None:
    root = tree(tmp_path, {"app/a.py": function("fits", 60) + function("over", 61)})

    assert breaches(root) == ["app/a.py:over: 61 lines (function limit 60)"]


def test_methods_and_nested_functions_are_counted_by_their_qualified_name(tmp_path: Path) -> None:
    # outer: its def, inner's 61 lines, one more; both are over.
    inner = "".join("        " + line + "\n" for line in function("inner", 61).splitlines())
    text = "class Box:\n    def outer(self) -> None:\n" + inner + "        pass\n"
    root = tree(tmp_path, {"app/b.py": text})

    assert breaches(root) == [
        "app/b.py:Box.outer: 63 lines (function limit 60)",
        "app/b.py:Box.outer.inner: 61 lines (function limit 60)",
    ]


def test_a_module_of_eight_hundred_lines_passes_and_of_801_does_not(tmp_path: Path) -> None:
    root = tree(tmp_path, {"app/ok.py": "x = 1\n" * 800, "app/big.py": "x = 1\n" * 801})

    assert breaches(root) == ["app/big.py: 801 lines (module limit 800)"]


def test_listed_exceptions_pass_and_excluded_paths_are_not_read(tmp_path: Path) -> None:
    files = {
        "app/data.py": "x = 1\n" * 900 + function("table", 70),
        "app/tests/test_x.py": function("long_test", 200),
    }
    root = tree(
        tmp_path,
        files,
        functions='"app/data.py:table" = "a data table"',
        modules='"app/data.py" = "data only"',
    )

    assert breaches(root) == []


def test_an_exception_within_its_bound_must_be_unlisted(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {"app/c.py": function("short", 10)},
        functions='"app/c.py:short" = "was long"',
        modules='"app/c.py" = "was long"',
    )

    found = breaches(root)

    assert len(found) == 2 and all("unlist it" in line for line in found)


def test_the_project_itself_is_within_its_limits() -> None:
    assert breaches(REPO) == []
