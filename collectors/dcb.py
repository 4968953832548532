"""DCB PFC and trust configuration from iproute2's ``dcb -j`` (when installed).

``dcb -j pfc show dev DEV`` prints ``{"pfc_cap":8,"macsec_bypass":false,"delay":4096,
"prio_pfc":[false,false,false,true,...]}`` (``dcb/dcb_pfc.c``: ``prio_pfc`` is a JSON array of
on/off per priority, via ``dcb_print_named_array``); ``dcb -j apptrust show dev DEV`` gives the
trust order. Devices without DCB ops make ``dcb`` fail ("Operation not supported"): absent.

This shells out, so :func:`collectors.snapshot.collect` only calls it for netdevs that back an
RDMA port (or when asked), keeping the sampling path fast.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from collectors.sample import CollectError

SOURCE = "dcb"


@dataclass(frozen=True)
class DcbConfig:
    pfc_enabled: dict[int, bool] | None
    pfc_raw: dict | None
    apptrust: dict | None

    def to_json(self) -> dict:
        return {"pfc_enabled": {str(k): v for k, v in sorted((self.pfc_enabled or {}).items())},
                "pfc": self.pfc_raw, "apptrust": self.apptrust}


def parse_pfc_json(text: str) -> tuple[dict[int, bool] | None, dict | None]:
    """``(prio → PFC on, raw object)`` from ``dcb -j pfc show`` output; ``(None, None)`` when
    the text is not a JSON object."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    prio = obj.get("prio_pfc")
    if isinstance(prio, list):
        return {i: bool(v) for i, v in enumerate(prio)}, obj
    if isinstance(prio, dict):
        return {int(k): bool(v) for k, v in prio.items() if str(k).isdigit()}, obj
    return None, obj


def _run(argv: list[str]) -> tuple[str | None, str | None]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    return r.stdout, None


def read_dcb(ifname: str, dcb_bin: str | None = None) -> tuple[DcbConfig | None, list[CollectError]]:
    """PFC and apptrust of ``ifname``; ``(None, [])`` when ``dcb`` is missing or the device
    has no DCB support."""
    dcb_bin = dcb_bin or shutil.which("dcb")
    if not dcb_bin:
        return None, []
    out, why = _run([dcb_bin, "-j", "pfc", "show", "dev", ifname])
    if out is None:
        if why and "not supported" in why.lower():
            return None, []
        return None, [CollectError(SOURCE, f"dcb pfc show dev {ifname}", why or "failed")]
    pfc, raw = parse_pfc_json(out)
    if raw is None:
        return None, [CollectError(SOURCE, f"dcb pfc show dev {ifname}", "garbage: not JSON")]
    trust_out, _ = _run([dcb_bin, "-j", "apptrust", "show", "dev", ifname])
    trust = None
    if trust_out:
        try:
            trust = json.loads(trust_out)
        except ValueError:
            trust = None
    return DcbConfig(pfc, raw, trust), []
