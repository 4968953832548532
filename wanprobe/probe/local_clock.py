"""This host's clock state for the probe paths: read once (collectors/clock_state.py), then
refreshed in a background thread at most every REFRESH_S, so a ``chronyc`` call never stalls a
sender's or a reflector's packet path. ``LOCAL_CLOCK`` is the process's one watcher; tests and
embedders pass their own (``read=`` a fake)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from collectors.clock_state import ClockState, read_clock_state
from wanprobe.probe import error_estimate
from wanprobe.probe.clock_tlvs import SAME_CLOCK_LEN, same_clock_verdict, timestamp_info_value

REFRESH_S = 60.0
MAX_VERDICTS = 4096


class ClockAnswer:
    """What a reflector puts in its replies for one clock state: the Error Estimate of T2/T3
    (RFC 4656 §4.1.2), the Timestamp Information value (RFC 8972 §4.3) and Same-clock verdicts
    (cached per nonce and digest: one hash per sender process, not per packet)."""

    __slots__ = ("state", "error_estimate", "timestamp_info", "_verdicts")

    def __init__(self, state: ClockState) -> None:
        self.state = state
        bound = state.error_bound_ms
        self.error_estimate = error_estimate.encode(None if bound is None else bound / 1e3,
                                                    synchronized=state.synchronized)
        self.timestamp_info = timestamp_info_value(state)
        self._verdicts: dict[bytes, int] = {}

    def same_clock(self, value: bytes) -> bytes:
        """The answered Same-clock TLV value (the request's nonce and digest, the verdict)."""
        key = bytes(value[:12])
        verdict = self._verdicts.get(key)
        if verdict is None:
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            verdict = self._verdicts[key] = same_clock_verdict(key, self.state.boot_id)
        return key + bytes((verdict,)) + bytes(SAME_CLOCK_LEN - 13)


class ClockWatcher:
    """The current :class:`ClockState`, kept fresh in the background (module docstring)."""

    def __init__(self, read: Callable[[], ClockState] = read_clock_state,
                 refresh_s: float = REFRESH_S) -> None:
        self._read = read
        self.refresh_s = refresh_s
        self._state: ClockState | None = None
        self._answer: ClockAnswer | None = None
        self._at = 0.0
        self._lock = threading.Lock()
        self._refreshing = False

    def current(self) -> ClockState:
        """The last reading; the first call reads synchronously, a stale one starts a refresh."""
        state = self._state
        if state is None:
            with self._lock:
                if self._state is None:
                    self._state = self._read()
                    self._at = time.monotonic()
                return self._state
        if time.monotonic() - self._at > self.refresh_s and not self._refreshing:
            self._refreshing = True
            threading.Thread(target=self._refresh, name="wanprobe-clock", daemon=True).start()
        return state

    def answer(self) -> ClockAnswer:
        """The reflector's answer for the current state (rebuilt when the state changed)."""
        state = self.current()
        ans = self._answer
        if ans is None or ans.state is not state:
            ans = self._answer = ClockAnswer(state)
        return ans

    def _refresh(self) -> None:
        try:
            state = self._read()
            self._state, self._at = state, time.monotonic()
        except Exception:   # a broken clock source keeps the last reading
            self._at = time.monotonic()
        finally:
            self._refreshing = False


LOCAL_CLOCK = ClockWatcher()
