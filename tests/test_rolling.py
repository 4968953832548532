"""wanprobe/diagnose/rolling.py: the per-peer windows the daemon's baseline and the path watch
share (issue 38)."""

from __future__ import annotations

from wanprobe.diagnose.rolling import PerPeer, Windows, median_known


def test_a_row_enters_the_reference_as_it_leaves_the_recent_window() -> None:
    w: Windows[int] = Windows(window=3, recent=2)
    moves = [w.push(i) for i in range(6)]
    assert moves == [(None, None), (None, None), (0, None), (1, None), (2, None), (3, 0)]
    assert list(w.history) == [1, 2, 3] and list(w.recent) == [4, 5]
    assert w.ready(3, 2) and not w.ready(4, 2)


def test_a_frozen_reference_learns_nothing_and_a_restart_makes_recent_the_reference() -> None:
    w: Windows[int] = Windows(window=3, recent=2)
    for i in range(4):
        w.push(i)
    assert w.push(9, learn=False) == (None, None) and list(w.history) == [0, 1]
    assert list(w.recent) == [3, 9]
    w.restart()
    assert list(w.history) == [3, 9] and list(w.recent) == [] and not w.ready(1, 2)
    assert w.history.maxlen == 3 and w.recent.maxlen == 2


def test_per_peer_state_is_made_on_first_use_and_forgotten() -> None:
    made: list[int] = []
    peers: PerPeer[list[int]] = PerPeer(lambda: made.append(1) or [])
    assert peers.get("a") is None and len(peers) == 0
    peers["a"].append(5)
    assert peers["a"] == [5] and len(made) == 1 and list(peers) == ["a"]
    peers.forget("a")
    peers.forget("never")
    assert peers.get("a") is None


def test_median_known_skips_the_unknown() -> None:
    assert median_known([3.0, None, 1.0, 2.0]) == 2.0
    assert median_known([None]) is None and median_known([]) is None
