"""A YAML writer for the plain documents wanprobe prints (Prometheus rules): mappings, lists,
strings, numbers and booleans. Every string is a JSON string, which YAML 1.2 reads as a
double-quoted scalar (YAML 1.2 §7.3.1), so no value can change meaning on the way."""

from __future__ import annotations

import json
from typing import Any


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"no YAML form for {type(value).__name__}")


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                out.append(f"{pad}{k}:")
                out += _lines(v, indent + 2)
            elif isinstance(v, dict | list):
                out.append(f"{pad}{k}: {'{}' if isinstance(v, dict) else '[]'}")
            else:
                out.append(f"{pad}{k}: {_scalar(v)}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            sub = _lines(item, indent + 2)
            out.append(f"{pad}- {sub[0].lstrip()}")
            out += sub[1:]
        return out
    return [pad + _scalar(value)]


def dumps(doc: Any) -> str:
    """``doc`` as block-style YAML text, ending in a newline."""
    return "\n".join(_lines(doc, 0)) + "\n"
