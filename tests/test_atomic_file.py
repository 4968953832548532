"""The one atomic writer: replaces the file whole, keeps the mode asked for, and leaves no temp
file behind when the write fails."""

from __future__ import annotations

import os

import pytest

from wanprobe.atomic_file import atomic_write


def test_replaces_whole_file_with_mode(tmp_path):
    p = tmp_path / "sub" / "state.json"
    atomic_write(p, "old\n")
    atomic_write(p, b"new\n", mode=0o600)
    assert p.read_bytes() == b"new\n"
    assert p.stat().st_mode & 0o777 == 0o600
    assert sorted(x.name for x in p.parent.iterdir()) == ["state.json"]


def test_failure_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "state.json"
    atomic_write(p, "old\n")

    def boom(_src, _dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(p, "new\n")
    assert p.read_text() == "old\n"
    assert [x.name for x in tmp_path.iterdir()] == ["state.json"]


def test_unencodable_data_leaves_no_temp(tmp_path):
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "x", 42)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
