"""The shape of a report document: its keys and the JSON type of each value, without the values
(they vary per run). tests/test_report_golden.py compares the report of a lab diagnose with the
shape recorded in tests/fixtures/golden/report_shape.json.

A shape is ``"null"``, ``"bool"``, ``"number"``, ``"string"`` (or alternatives joined by ``|``),
``"object"`` (any object: evidence, whose keys depend on the finding), ``{"<map>": shape}`` (an
object whose keys are data: interface, sysctl and counter names), ``{"<list>": shape}`` (None:
only empty lists seen) or a record ``{key: shape}`` whose optional keys start with ``?``. A
``null`` is a value this run did not measure: it matches any shape.
"""

from __future__ import annotations

from typing import Any

ANY = "*"
# paths whose objects are keyed by data (interface, device, sysctl, counter names)
MAPS = (("host", "sysctls"), ("host", "ifaces"), ("measurements", "errors"),
        ("measurements", "counters", "netdevs"), ("measurements", "counters", "rdma"),
        ("measurements", "counters", "tcp"), ("measurements", "counters", "udp"),
        ("measurements", "counters", "ip"), ("measurements", "counters", "sysctls"),
        ("measurements", "counters", "qdisc"),
        ("measurements", "counters", "netdevs", ANY, "stats"),
        ("measurements", "counters", "netdevs", ANY, "ethtool"),
        ("measurements", "counters", "netdevs", ANY, "units"))
# paths whose objects hold whatever their producer decided (evidence; per-counter rate trees)
OPAQUE = (("findings", "[]", "evidence"), ("measurements", ANY, "limited_by", "evidence"),
          ("measurements", "counters", "rates"), ("measurements", "counters", "findings", "[]",
                                                  "evidence"))


def _match(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(p == ANY or p == q for q, p in zip(path, pattern,
                                                                               strict=True))


def shape(v: Any, path: tuple[str, ...] = ()) -> Any:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return {"<list>": _merge_all([shape(x, (*path, "[]")) for x in v])}
    if any(_match(path, p) for p in OPAQUE):
        return "object"
    if any(_match(path, p) for p in MAPS):
        return {"<map>": _merge_all([shape(x, (*path, ANY)) for x in v.values()])}
    return {k: shape(x, (*path, k)) for k, x in v.items()}


def _merge_all(shapes: list[Any]) -> Any:
    out = None
    for s in shapes:
        out = merge(out, s)
    return out


def _record(s: Any) -> bool:
    return isinstance(s, dict) and not ({"<map>", "<list>"} & set(s))


def merge(a: Any, b: Any) -> Any:
    """One shape that both ``a`` and ``b`` satisfy."""
    if a is None or a == "null":
        return b if b is not None else a
    if b is None or b == "null" or a == b:
        return a
    if isinstance(a, str) and isinstance(b, str):
        return "|".join(sorted(set(a.split("|")) | set(b.split("|"))))
    if _record(a) and _record(b):
        names = {k.lstrip("?") for k in (*a, *b)}
        out = {}
        for n in sorted(names):
            x, y = a.get(n, a.get(f"?{n}")), b.get(n, b.get(f"?{n}"))
            required = n in a and n in b
            out[n if required else f"?{n}"] = merge(x, y)
        return out
    for kind in ("<map>", "<list>"):
        if isinstance(a, dict) and isinstance(b, dict) and kind in a and kind in b:
            return {kind: merge(a[kind], b[kind])}
    raise ValueError(f"shapes do not merge: {a!r} and {b!r}")


def differences(want: Any, got: Any, where: str = "") -> list[str]:
    """How ``got`` departs from ``want``: keys added or removed, types changed."""
    if want is None or got is None or want == "null" or got == "null":
        return []
    if isinstance(want, str):
        kinds = set(want.split("|"))
        if isinstance(got, str) and set(got.split("|")) <= kinds:
            return []
        if want == "object" and isinstance(got, dict):
            return []
        return [f"{where or '(top)'}: {_kind(got)}, was {want}"]
    if not isinstance(got, dict):
        return [f"{where}: {got}, was {_kind(want)}"]
    for kind in ("<map>", "<list>"):
        if kind in want:
            if kind not in got:
                return [f"{where}: {_kind(got)}, was {kind}"]
            return differences(want[kind], got[kind], f"{where}[]")
    if not _record(got):
        return [f"{where}: {_kind(got)}, was an object with keys"]
    out = []
    for k, sub in want.items():
        name = k.lstrip("?")
        if name not in got and f"?{name}" not in got:
            if not k.startswith("?"):
                out.append(f"{where}.{name}: removed")
            continue
        out += differences(sub, got.get(name, got.get(f"?{name}")), f"{where}.{name}")
    known = {k.lstrip("?") for k in want}
    out += [f"{where}.{k.lstrip('?')}: added" for k in got if k.lstrip("?") not in known]
    return out


def _kind(s: Any) -> str:
    if isinstance(s, str):
        return s
    if isinstance(s, dict):
        return next((k for k in ("<map>", "<list>") if k in s), "an object with keys")
    return repr(s)
