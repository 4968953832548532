"""wanprobe/userfiles.py helpers that need no file: the JSON object walk."""

from __future__ import annotations

from wanprobe.userfiles import json_objects


def test_json_objects_walks_every_object_in_document_order() -> None:
    doc = {"a": [{"k": 1, "b": {"k": 2}}, 3, [{"k": 4}]], "c": {"k": 5}}
    assert [o.get("k") for o in json_objects(doc)] == [None, 1, 2, 4, 5]
    assert list(json_objects([1, "x"])) == [] and list(json_objects(None)) == []
    deep: dict = {}
    node = deep
    for _ in range(5000):          # deeper than recursion would go
        node["n"] = {}
        node = node["n"]
    assert sum(1 for _ in json_objects(deep)) == 5001
