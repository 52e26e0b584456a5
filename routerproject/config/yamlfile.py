"""Reading the config file and walking its YAML node tree to plain values, remembering the
line of every key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from routerproject.config.errors import ConfigError

# Deep enough for any real config; stops a self-referencing YAML alias from recursing.
YAML_MAX_DEPTH = 32


class _YamlTree:
    """Turns a composed YAML node tree into plain values, remembering key lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[str, int] = {}
        self._constructor = SafeConstructor()

    def _error(self, message: str, node: Node, key: str | None) -> ConfigError:
        return ConfigError(message, key=key or None, line=node.start_mark.line + 1, path=self.path)

    def convert(self, node: Node, key: str, depth: int = 0) -> Any:
        if depth > YAML_MAX_DEPTH:
            raise self._error("nested too deeply", node, key)
        if isinstance(node, MappingNode):
            return self._mapping(node, key, depth)
        if isinstance(node, SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                child = f"{key}[{index}]"
                self.lines[child] = item.start_mark.line + 1
                items.append(self.convert(item, child, depth + 1))
            return items
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self._error(f"invalid value: {exc.problem}", node, key) from None

    def _mapping(self, node: MappingNode, key: str, depth: int) -> dict[str, Any]:
        try:
            self._constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            raise self._error(f"invalid merge: {exc.problem}", node, key) from None
        result: dict[str, Any] = {}
        seen: set[str] = set()
        for key_node, value_node in node.value:
            name = (
                self._constructor.construct_object(key_node)
                if isinstance(key_node, ScalarNode)
                else None
            )
            if not isinstance(name, str):
                raise self._error("keys must be plain names", key_node, key)
            child = f"{key}.{name}" if key else name
            if name in seen:
                raise self._error("duplicate key", key_node, child)
            seen.add(name)
            self.lines[child] = key_node.start_mark.line + 1
            value = self.convert(value_node, child, depth + 1)
            # "key:" with nothing after it means "not set" (as in the Go reference),
            # which also makes an empty section mean all defaults.
            if value is not None:
                result[name] = value
        return result


def parse_yaml(text: str, path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        detail = exc.problem or exc.context or "syntax error"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {detail}", line=line, path=path) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=path) from None
    if root is None:
        return {}, {}
    if not isinstance(root, MappingNode):
        raise ConfigError(
            "the top level must be a mapping of sections (server:, cluster:, models:, ...)",
            line=root.start_mark.line + 1,
            path=path,
        )
    tree = _YamlTree(path)
    data = tree.convert(root, "")
    return data, tree.lines


def read_config_text(path: Path) -> str:
    try:
        # utf-8-sig: editors on some systems prepend a byte-order mark.
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError("config file does not exist", path=path) from None
    except UnicodeDecodeError:
        raise ConfigError("config file is not valid UTF-8 text", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", path=path) from None
