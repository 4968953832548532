"""YAML for the documents wanprobe prints (Prometheus rules, Kubernetes manifests), written by
PyYAML (https://pyyaml.org/wiki/PyYAMLDocumentation) in block style.

Plain data only (mappings, lists, strings, numbers, booleans): ``SafeDumper`` quotes every
string a YAML 1.1 or 1.2 reader would take for another type (``"on"``, ``"1e3"``, ``"null"``),
so Prometheus (Go yaml) and kubectl read back exactly the document that was written; a shared
object is written out again instead of as an anchor/alias, lines are never folded (a PromQL
expression stays on one line as written) and a multi-line string is a literal block.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """SafeDumper without anchors: Kubernetes and Prometheus files are read by people too."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """A multi-line string (a file in a ConfigMap) as a literal block (YAML 1.2 §8.1.2), so it
    reads as the file; PyYAML falls back to a quoted scalar where a block cannot hold it."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", text,
                                   style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


_OPTIONS = {"Dumper": _Dumper, "default_flow_style": False, "sort_keys": False,
            "allow_unicode": True, "width": 2**31 - 1}


def dumps(doc: Any) -> str:
    """``doc`` as block-style YAML text, ending in a newline."""
    return yaml.dump(doc, **_OPTIONS)


def dumps_all(docs: Iterable[Any]) -> str:
    """Several documents as one YAML stream (``---`` between them), as ``kubectl apply -f`` reads."""
    return yaml.dump_all(list(docs), explicit_start=True, **_OPTIONS)
