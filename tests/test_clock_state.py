"""The clock-state collector (collectors/clock_state.py): chrony's tracking CSV, linuxptp's
TIME_STATUS_NP, the kernel's adjtimex, the order they are tried in, and a fake ``chronyc`` found
on PATH by the real command runner."""

from __future__ import annotations

import os
import stat

import pytest

from collectors import clock_state as cs

# `chronyc -c tracking` lines in the field order of chrony client.c process_cmd_tracking
SYNCED = ("A9FEA97B,169.254.169.123,3,1761000000.123456789,-0.000120000,0.000010,0.000050,"
          "-12.345,-0.001,0.012,0.002000000,0.000500000,64.2,Normal\n")
UNSYNCED = ("00000000,,0,0.000000000,0.000000000,0.000000,0.000000,0.000,0.000,0.000,"
            "1.000000000,1.000000000,0.0,Not synchronised\n")
LOCAL_REF = ("7F7F0101,,10,1761000000.0,0.000000001,0.0,0.0,0.0,0.0,0.0,0.000000000,"
             "0.000000000,16.0,Normal\n")
PHC_REF = ("50484330,PHC0,1,1761000000.0,0.000000020,0.0,0.0,0.0,0.0,0.0,0.000000000,"
           "0.000001000,1.0,Normal\n")
PMC = """sending: GET TIME_STATUS_NP
\t001122.fffe.334455-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP
\t\tmaster_offset              -250
\t\tingress_time               1761000000123456789
\t\tcumulativeScaledRateOffset +0.000000000
\t\tscaledLastGmPhaseChange    0
\t\tgmTimeBaseIndicator        0
\t\tlastGmPhaseChange          0x0000'0000000000000000.0000
\t\tgmPresent                  true
\t\tgmIdentity                 001122.fffe.334455
"""
KERNEL_SYNCED = {"state": 0, "status": 0x2001, "maxerror_us": 4500, "esterror_us": 120}
KERNEL_UNSYNC = {"state": 5, "status": cs.STA_UNSYNC, "maxerror_us": 16_000_000,
                 "esterror_us": 16_000_000}


def test_chrony_bound_is_offset_plus_dispersion_plus_half_delay():
    s = cs.parse_chronyc_tracking(SYNCED)
    assert s.source == "chrony" and s.synchronized and s.sync_source == "ntp"
    # chrony FAQ: |System time| + root dispersion + root delay / 2 = 0.12 + 0.5 + 1.0 ms
    assert s.error_bound_ms == pytest.approx(1.62)
    assert s.offset_ms == pytest.approx(-0.12) and s.leap == "Normal"


@pytest.mark.parametrize("text,sync", [(UNSYNCED, "free-running"), (LOCAL_REF, "free-running")])
def test_chrony_unsynchronised_or_own_local_reference_has_no_bound(text, sync):
    s = cs.parse_chronyc_tracking(text)
    assert not s.synchronized and s.error_bound_ms is None and s.sync_source == sync


def test_chrony_refclock_names_give_the_sync_source():
    s = cs.parse_chronyc_tracking(PHC_REF)
    assert s.synchronized and s.sync_source == "ptp"
    assert s.error_bound_ms == pytest.approx(0.00002 + 0.001)


@pytest.mark.parametrize("text", [None, "", "506 Cannot talk to daemon", "a,b,c",
                                  SYNCED.replace("-0.000120000", "nan")])
def test_not_a_tracking_report_is_none(text):
    assert cs.parse_chronyc_tracking(text) is None


def test_pmc_and_kernel_together():
    assert cs.parse_pmc_time_status(PMC) == (-250, True)
    assert cs.parse_pmc_time_status("no reply") is None
    kernel = cs.kernel_state(KERNEL_SYNCED)
    assert kernel.synchronized and kernel.error_bound_ms == 4.5
    ptp = cs.ptp_state(-250, True, kernel)
    assert ptp.synchronized and ptp.error_bound_ms == pytest.approx(0.00025)
    # a grandmaster but a system clock nobody disciplines (no phc2sys): not synchronised
    assert not cs.ptp_state(-250, True, cs.kernel_state(KERNEL_UNSYNC)).synchronized


def test_kernel_unsynchronised_and_unavailable():
    s = cs.kernel_state(KERNEL_UNSYNC)
    assert not s.synchronized and s.error_bound_ms is None and "STA_UNSYNC" in s.detail
    assert not cs.kernel_state(None).synchronized


def test_read_order_chrony_then_ptp_then_kernel(tmp_path):
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("0123abcd-0000-4000-8000-00000000beef\n")
    sock = tmp_path / "ptp4l"
    outputs = {cs.CHRONYC: SYNCED, cs.PMC: PMC}

    def run(argv):
        return outputs.get(argv)

    s = cs.read_clock_state(run=run, adjtimex=lambda: KERNEL_SYNCED, proc_root=tmp_path,
                            ptp_socket=sock)
    assert s.source == "chrony" and s.boot_id == "0123abcd-0000-4000-8000-00000000beef"
    outputs.pop(cs.CHRONYC)
    s = cs.read_clock_state(run=run, adjtimex=lambda: KERNEL_SYNCED, proc_root=tmp_path,
                            ptp_socket=sock)
    assert s.source == "kernel"          # no ptp4l socket: pmc is not even tried
    sock.touch()
    s = cs.read_clock_state(run=run, adjtimex=lambda: KERNEL_SYNCED, proc_root=tmp_path,
                            ptp_socket=sock)
    assert s.source == "ptp" and s.synchronized


def test_fake_chronyc_on_path_is_what_the_runner_reads(tmp_path, monkeypatch):
    fake = tmp_path / "chronyc"
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = \"-n -c tracking\" ] || exit 1\nprintf '{UNSYNCED}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    s = cs.read_clock_state()
    assert s.source == "chrony" and not s.synchronized and "not synchronised" in s.detail


def test_live_adjtimex_and_boot_id():
    tx = cs.read_adjtimex()
    assert tx is not None and tx["maxerror_us"] >= 0      # Linux: the call works unprivileged
    boot = cs.read_boot_id()
    assert boot and boot == open("/proc/sys/kernel/random/boot_id").read().strip()
