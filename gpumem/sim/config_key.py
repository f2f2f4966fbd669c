"""A whole-number key of a config file, read and set: ``gpumem fit --vary FILE:KEY=LO..HI``.

KEY is dotted (training.local_batch_size): the table or mappings that hold
it, then its name.  Three formats, by the file's suffix:
- .json: the text is parsed and written again (2-space indent); the key's
  value must be an integer (not a boolean);
- .toml: one line ``name = 8`` under the ``[table]`` header that completes
  the dotted key (dotted names on the line count: ``a.b = 8``); everything
  else is kept byte for byte;
- .yaml / .yml: one line ``name: 8`` inside the block mappings that
  complete the dotted key, by indentation; everything else is kept.
The TOML and YAML readers know only those shapes (no inline tables, flow
mappings, anchors or multi-line strings around the key); a key they cannot
find is an error, never a guess.  Nothing here runs anything or writes a file.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["SUFFIXES", "ConfigKeyError", "read", "write"]

SUFFIXES = (".json", ".toml", ".yaml", ".yml")
_INT = r"[-+]?\d+"


class ConfigKeyError(ValueError):
    """The key is not in the file as a whole number."""


def _suffix(path: str) -> str:
    for s in SUFFIXES:
        if path.lower().endswith(s):
            return s
    raise ConfigKeyError(f"{path}: a config file must end in {', '.join(SUFFIXES)}")


def _json_parent(data: Any, key: list[str], path: str) -> dict:
    node = data
    for part in key[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or key[-1] not in node:
        raise ConfigKeyError(f"{path} has no key {'.'.join(key)}")
    value = node[key[-1]]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigKeyError(f"{path}: {'.'.join(key)} is {value!r}, not a whole number")
    return node


def _toml_line(lines: list[str], key: list[str]) -> int:
    table: list[str] = []
    for i, line in enumerate(lines):
        s = line.strip()
        head = re.match(r"\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$", s)
        if head:
            table = [p.strip().strip('"') for p in head.group(1).split(".")]
            continue
        m = re.match(rf"([A-Za-z0-9_\-.\" ]+?)\s*=\s*{_INT}\s*(#.*)?$", s)
        if m and table + [p.strip().strip('"') for p in m.group(1).split(".")] == key:
            return i
    return -1


def _yaml_line(lines: list[str], key: list[str]) -> int:
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"( *)([A-Za-z0-9_\-.]+|\"[^\"]*\"|'[^']*')\s*:(?:\s+(.*))?$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, name = len(m.group(1)), m.group(2).strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value = re.sub(r"\s+#.*$", "", m.group(3) or "").strip()
        if not value:
            stack.append((indent, name))
        elif [n for _, n in stack] + [name] == key and re.fullmatch(_INT, value):
            return i
    return -1


def _line(text: str, suffix: str, key: list[str], path: str) -> tuple[list[str], int]:
    lines = text.splitlines(keepends=True)
    at = (_toml_line if suffix == ".toml" else _yaml_line)(lines, key)
    if at < 0:
        raise ConfigKeyError(f"{path} has no line setting {'.'.join(key)} to a whole number")
    return lines, at


def read(text: str, path: str, key: str) -> int:
    """The key's value in the file's text; ConfigKeyError when it has none."""
    suffix, parts = _suffix(path), key.split(".")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigKeyError(f"{path} is not JSON ({e})") from None
        return _json_parent(data, parts, path)[parts[-1]]
    lines, at = _line(text, suffix, parts, path)
    sep = "=" if suffix == ".toml" else ":"
    return int(re.search(rf"{re.escape(sep)}\s*({_INT})", lines[at]).group(1))


def write(text: str, path: str, key: str, value: int) -> str:
    """The file's text with the key set to value."""
    suffix, parts = _suffix(path), key.split(".")
    if suffix == ".json":
        data = json.loads(text)
        _json_parent(data, parts, path)[parts[-1]] = value
        return json.dumps(data, indent=2) + "\n"
    lines, at = _line(text, suffix, parts, path)
    sep = "=" if suffix == ".toml" else ":"
    lines[at] = re.sub(rf"({re.escape(sep)}\s*){_INT}", lambda m: f"{m.group(1)}{value}",
                       lines[at], count=1)
    return "".join(lines)
