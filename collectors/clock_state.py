"""How good this host's clock is, read-only: chrony, else linuxptp, else the kernel.

One-way delay (RFC 7679) subtracts a timestamp taken on one host from one taken on another, so its
absolute value is only as good as the two clocks. This module reads what the host itself knows
about its system clock (CLOCK_REALTIME, which the probe timestamps use), in this order:

1. chrony: ``chronyc -n -c tracking`` (``-n``: no DNS lookup of the reference; ``-c``: CSV). The
   fields are chrony's ``tracking`` report (chrony client.c ``process_cmd_tracking``): reference
   ID, name, stratum, reference time, *System time* (the correction still to apply, s), last
   offset, RMS offset, frequency, residual frequency, skew, root delay, root dispersion, update
   interval, leap status. Worst-case error = |System time| + root dispersion + root delay / 2
   (chrony FAQ, "How accurate is my system clock?": root distance plus the remaining correction).
2. linuxptp, where ptp4l runs (its management socket exists): ``pmc -u -b 0 'GET
   TIME_STATUS_NP'`` gives ``master_offset`` (ns) and ``gmPresent`` (linuxptp pmc.c). That is the
   PHC's offset; the system clock follows it only if phc2sys runs, which clears the kernel's
   STA_UNSYNC (linuxptp clockadj.c ``sysclk_set_sync``), so PTP counts as synchronised only when
   the kernel agrees. The phc2sys residual (PHC to system clock) is not in TIME_STATUS_NP and is
   not included.
3. The kernel: ``adjtimex(2)`` with ``modes = 0`` (read only): STA_UNSYNC / TIME_ERROR say the
   clock is not disciplined; otherwise ``maxerror`` (µs) is the worst case the disciplining daemon
   declared, grown by 500 ppm since (kernel/time/ntp.c ``second_overflow``). The kernel does not
   say which daemon disciplines it; the sync source is then reported as NTP, the usual one.

The commands, the adjtimex call and the /proc root are arguments (docs/conventions.md §1), so
tests drive the parsers with fixture text and a fake ``chronyc`` on PATH. Nothing here changes
the clock. The boot id (``/proc/sys/kernel/random/boot_id``, random per boot, the same in every
network namespace) tells whether two ends read one kernel clock.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

CHRONYC = ("chronyc", "-n", "-c", "tracking")
PMC = ("pmc", "-u", "-b", "0", "GET TIME_STATUS_NP")
PTP4L_SOCKET = Path("/var/run/ptp4l")   # ptp4l's default uds_address
COMMAND_TIMEOUT_S = 1.0
STA_UNSYNC = 0x0040                     # include/uapi/linux/timex.h
TIME_ERROR = 5                          # adjtimex return: clock not synchronised
CHRONY_LOCAL_REFID = "7F7F0101"         # chrony's `local` reference: its own free-running clock
_CHRONY_REFCLOCK_SOURCES = {"PHC": "ptp", "GPS": "gnss", "PPS": "gnss", "NMEA": "gnss",
                            "GNSS": "gnss", "GAL": "gnss", "GLO": "gnss"}

Runner = Callable[[tuple[str, ...]], str | None]


@dataclass(frozen=True)
class ClockState:
    """The system clock's state as one source reports it. ``error_bound_ms`` is the worst-case
    offset from UTC, None when unknown (not synchronised); ``sync_source`` is what disciplines
    the clock (ntp, ptp, gnss, free-running); ``detail`` is one line for people."""

    source: str                          # chrony, ptp or kernel
    synchronized: bool
    error_bound_ms: float | None
    sync_source: str
    detail: str
    offset_ms: float | None = None
    root_delay_ms: float | None = None
    root_dispersion_ms: float | None = None
    leap: str | None = None
    boot_id: str | None = None

    def to_json(self) -> dict:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        return {"source": self.source, "synchronized": self.synchronized,
                "error_bound_ms": r(self.error_bound_ms), "sync_source": self.sync_source,
                "offset_ms": r(self.offset_ms), "root_delay_ms": r(self.root_delay_ms),
                "root_dispersion_ms": r(self.root_dispersion_ms), "leap": self.leap,
                "detail": self.detail}


def _float(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def parse_chronyc_tracking(text: str | None) -> ClockState | None:
    """``chronyc -c tracking`` output → ClockState; None when it is not that report."""
    line = (text or "").strip().splitlines()
    if not line:
        return None
    f = line[0].split(",")
    if len(f) < 14:
        return None
    offset_s, root_delay_s, root_disp_s = _float(f[4]), _float(f[10]), _float(f[11])
    if offset_s is None or root_delay_s is None or root_disp_s is None:
        return None
    leap = f[13].strip()
    refid = f[0].strip().upper()
    name = f[1].strip()
    sync = next((v for k, v in _CHRONY_REFCLOCK_SOURCES.items() if name.upper().startswith(k)),
                "ntp")
    synced = leap in ("Normal", "Insert second", "Delete second")
    if refid == CHRONY_LOCAL_REFID:
        sync, synced = "free-running", False
    bound = abs(offset_s) + root_disp_s + root_delay_s / 2 if synced else None
    detail = (f"chrony: {leap.lower()}, reference {name or refid}, stratum {f[2].strip()}, "
              f"offset {offset_s * 1e3:+.3f} ms, root delay {root_delay_s * 1e3:.3f} ms, "
              f"root dispersion {root_disp_s * 1e3:.3f} ms")
    return ClockState("chrony", synced, None if bound is None else bound * 1e3,
                      sync if synced else "free-running", detail, offset_s * 1e3,
                      root_delay_s * 1e3, root_disp_s * 1e3, leap)


def parse_pmc_time_status(text: str | None) -> tuple[int, bool] | None:
    """(master_offset ns, gmPresent) from ``pmc 'GET TIME_STATUS_NP'``; None when absent."""
    offset = present = None
    for raw in (text or "").splitlines():
        parts = raw.split()
        if len(parts) != 2:
            continue
        if parts[0] == "master_offset":
            try:
                offset = int(parts[1])
            except ValueError:
                return None
        elif parts[0] == "gmPresent":
            present = parts[1] == "true"
    if offset is None or present is None:
        return None
    return offset, present


def kernel_state(tx: dict | None) -> ClockState:
    """ClockState from an adjtimex reading (``state``, ``status``, ``maxerror_us``,
    ``esterror_us``); unsynchronised when the call failed."""
    if tx is None:
        return ClockState("kernel", False, None, "free-running", "kernel: adjtimex unavailable")
    unsync = tx["state"] == TIME_ERROR or bool(tx["status"] & STA_UNSYNC)
    maxerr_ms = tx["maxerror_us"] / 1e3
    if unsync:
        return ClockState("kernel", False, None, "free-running",
                          f"kernel: not synchronised (STA_UNSYNC), maxerror {maxerr_ms:g} ms")
    return ClockState("kernel", True, maxerr_ms, "ntp",
                      f"kernel: synchronised, maxerror {maxerr_ms:g} ms, "
                      f"esterror {tx['esterror_us'] / 1e3:g} ms")


def ptp_state(offset_ns: int, gm_present: bool, kernel: ClockState) -> ClockState:
    """PTP's view, synchronised only when a grandmaster is present and the kernel clock is
    disciplined (phc2sys; see the module docstring)."""
    synced = gm_present and kernel.synchronized
    detail = (f"ptp: master_offset {offset_ns} ns, gmPresent {str(gm_present).lower()}, "
              f"system clock {'disciplined' if kernel.synchronized else 'not disciplined'}")
    return ClockState("ptp", synced, abs(offset_ns) / 1e6 if synced else None,
                      "ptp" if synced else "free-running", detail, offset_ns / 1e6)


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex (include/uapi/linux/timex.h), read with modes = 0."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
                ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


def read_adjtimex() -> dict | None:
    """The kernel's clock state via adjtimex(2) with modes = 0 (changes nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)   # the C library already loaded (no ldconfig)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return {"state": state, "status": tx.status, "maxerror_us": tx.maxerror,
            "esterror_us": tx.esterror}


def run_command(argv: tuple[str, ...]) -> str | None:
    """stdout of ``argv`` (found on PATH) when it exits 0 within COMMAND_TIMEOUT_S, else None."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def read_boot_id(proc_root: Path = Path("/proc")) -> str | None:
    """This kernel's boot id (random per boot), None when unreadable."""
    try:
        text = (Path(proc_root) / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return text if 8 <= len(text) <= 64 else None


def read_clock_state(*, run: Runner = run_command,
                     adjtimex: Callable[[], dict | None] = read_adjtimex,
                     proc_root: Path = Path("/proc"),
                     ptp_socket: Path = PTP4L_SOCKET) -> ClockState:
    """This host's clock state (chrony, else PTP, else the kernel) with its boot id."""
    boot_id = read_boot_id(proc_root)
    state = parse_chronyc_tracking(run(CHRONYC))
    if state is None:
        kernel = kernel_state(adjtimex())
        ptp = parse_pmc_time_status(run(PMC)) if Path(ptp_socket).exists() else None
        state = ptp_state(*ptp, kernel) if ptp is not None else kernel
    return replace(state, boot_id=boot_id)
