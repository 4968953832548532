"""A third-party STAMP reflector written from scapy's layer (scapy.contrib.stamp), for the clock
tests: it answers the Timestamp Information TLV with constants (NTP, SW local), as
cerfcast/teaparty does whatever its clock is doing, claims a synchronised clock with a 1 ms
Error Estimate (S=1, Scale 15, Multiplier 132), and echoes every other TLV untouched (U set).
It cannot say whether it shares the sender's clock.

Importable (``reply``) and runnable in a lab namespace: ``python third_party_reflector.py ADDR
PORT`` serves until killed and prints ``ready`` once bound."""

from __future__ import annotations

import socket
import sys
import time

NTP_OFFSET = 2208988800
ERROR = {"S": 1, "Z": 0, "scale": 15, "multiplier": 132}


def reply(data: bytes, count: int, t2: float) -> bytes:
    """The reflected packet for ``data`` (stateful: ``count`` is the reflector's sequence)."""
    from scapy.contrib import stamp

    s = stamp.STAMPSessionSenderTestUnauthenticated(data)
    tlvs = [stamp.STAMPTestTLV(flags=0, type=3, len=4, value=bytes((1, 2, 1, 2)))
            if t.type == 3 else t for t in s.tlv_objects]
    out = stamp.STAMPSessionReflectorTestUnauthenticated(
        seq=count, ts=time.time() + NTP_OFFSET, ssid=s.ssid,
        err_estimate=stamp.ErrorEstimate(**ERROR), ts_rx=t2 + NTP_OFFSET, seq_sender=s.seq,
        ts_sender=s.ts, err_estimate_sender=s.err_estimate, ttl_sender=64, tlv_objects=tlvs)
    return bytes(out)[:len(data)]


def main(addr: str, port: int) -> None:
    import scapy.contrib.stamp  # noqa: F401  (imported before serving: T2 is taken in Python)

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, port))
    print("ready", flush=True)
    count = 0
    while True:
        data, peer = sock.recvfrom(65536)
        t2 = time.time()
        try:
            sock.sendto(reply(data, count, t2), peer)
        except Exception:   # not a STAMP packet: a reflector keeps serving
            continue
        count += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
