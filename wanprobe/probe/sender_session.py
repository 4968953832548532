"""What a :class:`~wanprobe.probe.sender.StampSender` session needs besides the socket, for
callers that drive sessions themselves (the daemon's prober: ``open_session`` / ``send_probe`` /
``end_session``, then :func:`session_result`): the summary of an ended session, and the probe
template cache (the daemon opens a session per peer every interval)."""

from __future__ import annotations

from wanprobe.probe.owd import OwdClock
from wanprobe.probe.probe_summary import summarize
from wanprobe.probe.probe_tlvs import probe_template
from wanprobe.probe.result import ProbeResult

_TEMPLATES: dict[tuple, bytes] = {}


def session_result(sess, duration_s: float) -> ProbeResult:
    """The summary of an ended session (probe_summary.summarize over its records)."""
    return summarize(
        method="stamp", peer=sess.peer, port=sess.port, started_ns=sess.started_ns,
        duration_s=duration_s, interval_s=sess.interval_s, size_bytes=sess.size_bytes,
        dscp=sess.dscp, sent=len(sess.tx_user_ns), tx_user_ns=sess.tx_user_ns,
        tx_kernel_ns=sess.tx_kernel_ns, replies=sess.replies, timeout_ns=sess.timeout_ns,
        follow_up_ns=sess.follow_up_ns, reports=sess.report,
        clock=OwdClock(sess.clock.local, sess.clock.far()) if sess.clock is not None else None,
    )


def template_for(sess) -> bytearray:
    """A fresh copy of :func:`~wanprobe.probe.probe_tlvs.probe_template` (built once per DSCP,
    length and mode)."""
    key = (sess.dscp, sess.payload_len, sess.auth is not None,
           sess.clock.local.boot_id if sess.clock is not None else None)
    made = _TEMPLATES.get(key)
    if made is None:
        made = _TEMPLATES[key] = bytes(probe_template(sess))
    return bytearray(made)
