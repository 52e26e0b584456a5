"""Size limits of product code, checked by ./scripts/test: lines per function and per module.

Ruff bounds a function's statements, branches and complexity; this bounds its lines (a long
literal or a long chain of awaits hides from those) and a module's lines. The bounds and the
few justified exceptions, each with its reason, are in pyproject.toml, [tool.router-limits]. An
exception that no longer exceeds its bound is reported too, so the list only ever shrinks.

    python scripts/limits.py [ROOT]    # prints each breach; exit 1 when there is one
"""

from __future__ import annotations

import ast
import fnmatch
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    function_lines: int
    module_lines: int
    paths: tuple[str, ...]
    exclude: tuple[str, ...]
    functions: dict[str, str]
    """`path:qualname` -> why it may be longer."""
    modules: dict[str, str]
    """path -> why it may be longer."""


def load(root: Path) -> Limits:
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["router-limits"]
    return Limits(
        function_lines=int(table["max-function-lines"]),
        module_lines=int(table["max-module-lines"]),
        paths=tuple(table["paths"]),
        exclude=tuple(table.get("exclude", ())),
        functions=dict(table.get("function-exceptions", {})),
        modules=dict(table.get("module-exceptions", {})),
    )


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function, nested too."""
    found: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            found.append((name, node.end_lineno - node.lineno + 1))
            found += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, prefix + node.name + ".")
        else:
            found += _functions(node, prefix)
    return found


def sources(root: Path, limits: Limits) -> list[Path]:
    files: list[Path] = []
    for top in limits.paths:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not any(fnmatch.fnmatch(rel, pattern) for pattern in limits.exclude):
                files.append(path)
    return files


def breaches(root: Path, limits: Limits) -> list[str]:
    found: list[str] = []
    seen_functions: set[str] = set()
    seen_modules: set[str] = set()
    for path in sources(root, limits):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > limits.module_lines:
            seen_modules.add(rel)
            if rel not in limits.modules:
                found.append(f"{rel}: {lines} lines (module limit {limits.module_lines})")
        for name, length in _functions(ast.parse(text, filename=rel)):
            key = f"{rel}:{name}"
            if length > limits.function_lines:
                seen_functions.add(key)
                if key not in limits.functions:
                    found.append(f"{key}: {length} lines (function limit {limits.function_lines})")
    for key in sorted(set(limits.functions) - seen_functions):
        found.append(f"{key}: listed as an exception but within the limit (or gone): unlist it")
    for rel in sorted(set(limits.modules) - seen_modules):
        found.append(f"{rel}: listed as an exception but within the limit (or gone): unlist it")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = breaches(root, load(root))
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
