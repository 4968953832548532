"""TX stamp pairing (probe/timestamps.py TxStampTracker) on a real UDP socket: a stamp the
tracker never sees (here read off the error queue behind its back, as when the kernel drops it on
a full error queue) is forgotten once later stamps have come, so the pending map cannot grow."""

from __future__ import annotations

import socket
import time

from wanprobe.probe import timestamps as ts


def _socket_pair():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ts.enable_rx_metadata(tx, timestamping=True, tx_timestamps=True, ttl_and_dst=False)
    tx.setblocking(False)
    return tx, rx


def _send(tx, rx, tracker, n: int, tag: str) -> None:
    for i in range(n):
        tx.sendto(b"x" * 44, rx.getsockname())
        tracker.sent((tag, i))


def _drain(tx, tracker) -> list:
    out = []
    for _ in range(50):  # stamps are queued by the kernel right after the send
        out += tracker.drain(tx)
        if not tracker.pending:
            break
        time.sleep(0.01)
    return out


def test_a_lost_stamp_is_dropped_after_the_reorder_slack_and_kept_within_it():
    tx, rx = _socket_pair()
    try:
        tracker = ts.TxStampTracker()
        _send(tx, rx, tracker, 1, "lost")
        time.sleep(0.05)
        assert len(ts.read_tx_timestamps(tx)) == 1  # consumed behind the tracker's back
        _send(tx, rx, tracker, ts.REORDER_SLACK // 2, "near")
        got = _drain(tx, tracker)
        assert len(got) == ts.REORDER_SLACK // 2 and all(w[0] == "near" for w, _ns in got)
        assert list(tracker.pending.values()) == [("lost", 0)]  # may still be late: kept
        _send(tx, rx, tracker, ts.REORDER_SLACK, "far")
        got = _drain(tx, tracker)
        assert len(got) == ts.REORDER_SLACK and all(ns > 0 for _w, ns in got)
        assert tracker.pending == {}  # older than the slack: never coming, forgotten
    finally:
        tx.close()
        rx.close()
