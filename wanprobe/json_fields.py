"""Decoding a measurement's JSON back into its result (issue 21, "one codec"): the one set of
shape checks that probe/ and throughput/ results' ``from_json`` use.

The JSON a result's ``to_json`` writes is the canonical form: ``X.from_json(doc).to_json() ==
doc``. A report is validated against report/schema.json before anything decodes it, so the
values' types are the schema's; what is checked here is the shape, so that a document missing a
key or holding a scalar where an object belongs is refused in one line (conventions §8), never
with a KeyError or TypeError traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Any, ClassVar, Self, TypeVar

from wanprobe.errors import ConfigError, shown

T = TypeVar("T")


def json_object(d: Any, what: str) -> Mapping[str, Any]:
    """``d`` when it is a JSON object; else ConfigError naming ``what``."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{what}: expected a JSON object, got {shown(d)}")
    return d


def json_list(d: Any, what: str) -> list | tuple:
    """``d`` when it is a JSON array; else ConfigError naming ``what``."""
    if not isinstance(d, list | tuple):
        raise ConfigError(f"{what}: expected a JSON array, got {shown(d)}")
    return d


def required(d: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """ConfigError naming the first of ``keys`` that ``d`` lacks."""
    missing = [k for k in keys if k not in d]
    if missing:
        raise ConfigError(f"{what}: missing key {missing[0]!r}")


def fields(d: Any, what: str, keys: tuple[str, ...]) -> list[Any]:
    """The values of ``keys`` in the JSON object ``d``, in order (a result written positionally,
    probe/result.py); one-line ConfigError if ``d`` is no object or lacks one of them."""
    d = json_object(d, what)
    required(d, keys, what)
    return [d[k] for k in keys]


def pair(value: Any) -> tuple[float, float] | None:
    """A written ``[low, high]`` interval back as a tuple (None stays None)."""
    return None if value is None else (value[0], value[1])


def quantiles(d: Any, what: str, keys: tuple[str, ...]) -> tuple[float, ...] | None:
    """The quantiles ``keys`` of ``d``; None when every one was null (nothing measured)."""
    values = fields(d, what, keys)
    return None if all(v is None for v in values) else tuple(values)


def objects(d: Any, what: str, decode: Callable[[Any, str], T]) -> tuple[T, ...]:
    """A JSON array of objects, each decoded by ``decode(item, what[i])``."""
    return tuple(decode(item, f"{what}[{i}]") for i, item in enumerate(json_list(d, what)))


def dicts(d: Any, what: str) -> tuple[dict, ...]:
    """A JSON array of open objects (kept as dicts)."""
    return objects(d, what, open_object)


def optional(decode: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    """``decode`` for a part that may be null."""
    return lambda d, what: None if d is None else decode(d, what)


def open_object(d: Any, what: str) -> dict:
    """An open JSON object (evidence, cpu, a TCP_INFO summary), kept as a dict."""
    return dict(json_object(d, what))


def strings(d: Any, what: str) -> tuple[str, ...]:
    """A JSON array of strings (notes)."""
    items = json_list(d, what)
    if not all(isinstance(x, str) for x in items):
        raise ConfigError(f"{what}: expected strings, got {shown(items)}")
    return tuple(items)


def build(cls: Callable[..., T], d: Any, what: str,
          convert: Mapping[str, Callable[[Any, str], Any]] | None = None) -> T:
    """``cls`` from the JSON its ``asdict``-shaped ``to_json`` wrote: each field is the key of
    the same name (conventions §4). A field without a default must be present; one with a
    default may be absent (a report from before the minor version that added it). ``convert``
    maps a field name to ``fn(value, where)`` for the nested parts; keys not among the fields
    are left out."""
    d = json_object(d, what)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in d:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(f"{what}: missing key {f.name!r}")
            continue
        value = d[f.name]
        fn = (convert or {}).get(f.name)
        kwargs[f.name] = fn(value, f"{what}.{f.name}") if fn else value
    return cls(**kwargs)


class Decoded:
    """Mixin giving a result dataclass ``from_json`` through :func:`build`, declared in the
    class statement: ``class X(Decoded, json_name="x", json_parts={"part": decode})``. The name
    (by default the class's; a parent passes the key path instead) is what errors call it, the
    parts decode its nested values; both are class attributes, so not dataclass fields."""

    JSON_NAME: ClassVar[str] = "result"
    JSON_PARTS: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {}

    def __init_subclass__(cls, json_name: str | None = None,
                          json_parts: Mapping[str, Callable[[Any, str], Any]] | None = None,
                          **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.JSON_NAME, cls.JSON_PARTS = json_name or cls.__name__, dict(json_parts or {})

    @classmethod
    def from_json(cls, d: Any, what: str | None = None) -> Self:
        """The result from the JSON its ``to_json`` wrote; one-line ConfigError if malformed."""
        return build(cls, d, what or cls.JSON_NAME, cls.JSON_PARTS)
