"""The ``Lab`` context manager: two namespaces joined by an emulated WAN link.

``up()`` validates everything first, cleans a stale lab of the same name (namespaces or registry
left by a crash), refuses a name in use by a live lab, then creates the namespaces, starts the
forwarder (which creates the TUN devices inside them), configures addresses, MTU and the
shaper inside the namespaces, and calibrates the host's own RTT overhead away (calibrate.py;
``calibrate=False`` to skip). Nothing is configured in the root namespace. A lab is removed by
its forwarder when the process that brought it up exits, unless ``persistent=True`` (the CLI). ``down()`` is
idempotent and removes processes inside the namespaces, the forwarder, the namespaces (and so
the devices) and the registry entry.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from wanprobe.errors import LabError, PermissionRequired, UsageError
from wanprobe.lab import calibrate, netns, registry, shaping
from wanprobe.lab.netns import Endpoint
from wanprobe.lab.profiles import get_profile
from wanprobe.lab.settings import LinkSettings

ADDR_A = "198.18.0.1"
ADDR_B = "198.18.0.2"
IFNAME = "wan0"
NS_PREFIX = "wp-"
FORWARDER_MODULE = "wanprobe.lab.forwarder"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_UNSET = object()
_counter = itertools.count()


def namespace_names(name: str) -> tuple[str, str]:
    return f"{NS_PREFIX}{name}-a", f"{NS_PREFIX}{name}-b"


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise UsageError(f"bad lab name {name!r}: use 1-40 of A-Z a-z 0-9 _ . - (not starting with . _ -)")
    return name


CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def effective_caps(status_text: str) -> int:
    """CapEff bit mask from the text of /proc/<pid>/status (see proc(5))."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def require_root() -> None:
    """Raise PermissionRequired unless we may create namespaces and TUN devices."""
    caps = effective_caps(Path("/proc/self/status").read_text())
    needed = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)
    if os.geteuid() != 0 or caps & needed != needed:
        raise PermissionRequired("the lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for "
                                 "network namespaces and TUN devices); run as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LabError(f"`{tool}` not found: install iproute2")
    if not Path("/dev/net/tun").exists():
        raise LabError("/dev/net/tun is missing: load the tun module (modprobe tun)")


@contextlib.contextmanager
def down_on_error(down: Callable[[], None]) -> Iterator[None]:
    """Building a lab is all or nothing: on any error (Ctrl-C included) run ``down`` to remove
    what was made — its own errors are swallowed, the first one is the one to report — and
    re-raise."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            down()
        raise


def forwarder_pids(name: str) -> list[int]:
    """Live forwarder processes serving lab ``name`` (found via /proc, registry or not)."""
    want = ["-m", FORWARDER_MODULE, "--name", name]
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if any(args[i:i + 4] == want for i in range(len(args))) and netns._alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def resolve_settings(profile: str | None = None, *, rtt_ms=_UNSET, jitter_ms=_UNSET, loss=_UNSET,
                     loss_ab=None, loss_ba=None, rate_bps=_UNSET, mtu=1500,
                     black_hole_mtu=None, bleach_dscp=False, reorder=0.0,
                     delay_ab_ms=None, delay_ba_ms=None) -> LinkSettings:
    """Combine a profile with explicit values (explicit wins) and validate the result. One-way
    delays combine with the RTT as :meth:`LinkSettings.with_delays` says (an explicit RTT)."""
    base = {"rtt_ms": 60.0, "jitter_ms": 0.0, "loss": 0.0, "rate_bps": None}
    if profile is not None:
        p = get_profile(profile)
        base = {"rtt_ms": p.rtt_ms, "jitter_ms": p.jitter_ms, "loss": p.loss, "rate_bps": p.rate_bps}
    pick = {k: (base[k] if v is _UNSET else v) for k, v in
            (("rtt_ms", rtt_ms), ("jitter_ms", jitter_ms), ("loss", loss), ("rate_bps", rate_bps))}
    loss_all = pick["loss"] if pick["loss"] is not None else 0.0
    return LinkSettings(
        rtt_ms=pick["rtt_ms"], jitter_ms=pick["jitter_ms"],
        loss_ab=loss_all if loss_ab is None else loss_ab,
        loss_ba=loss_all if loss_ba is None else loss_ba,
        rate_bps=pick["rate_bps"], mtu=mtu, black_hole_mtu=black_hole_mtu,
        bleach_dscp=bleach_dscp, reorder=reorder,
    ).with_delays(None if rtt_ms is _UNSET else pick["rtt_ms"], delay_ab_ms,
                  delay_ba_ms).validated()


class Lab:
    """An emulated WAN link between namespaces ``a`` and ``b``; see the module docstring."""

    def __init__(self, name: str | None = None, rtt_ms=_UNSET, jitter_ms=_UNSET, loss=_UNSET,
                 loss_ab: float | None = None, loss_ba: float | None = None, rate_bps=_UNSET,
                 mtu: int = 1500, black_hole_mtu: int | None = None, bleach_dscp: bool = False,
                 reorder: float = 0.0, profile: str | None = None, offload: bool = True,
                 persistent: bool = False, calibrate: bool = True,
                 delay_ab_ms: float | None = None, delay_ba_ms: float | None = None) -> None:
        self.name = validate_name(name if name is not None else f"lab{os.getpid()}-{next(_counter)}")
        self.profile = profile
        self.settings = resolve_settings(
            profile, rtt_ms=rtt_ms, jitter_ms=jitter_ms, loss=loss, loss_ab=loss_ab,
            loss_ba=loss_ba, rate_bps=rate_bps, mtu=mtu, black_hole_mtu=black_hole_mtu,
            bleach_dscp=bleach_dscp, reorder=reorder, delay_ab_ms=delay_ab_ms,
            delay_ba_ms=delay_ba_ms)
        self.offload = offload
        # A non-persistent lab is removed by its forwarder when the process that brought it up
        # exits, so a test killed with SIGKILL leaves nothing behind; `wanprobe lab up` is
        # persistent until `wanprobe lab down`.
        self.persistent = persistent
        self.calibrate = calibrate
        self.offset_ns = 0
        ns_a, ns_b = namespace_names(self.name)
        self.a = Endpoint(ns_a, IFNAME, ADDR_A, ADDR_B)
        self.b = Endpoint(ns_b, IFNAME, ADDR_B, ADDR_A)
        self._proc: subprocess.Popen | None = None
        self._started: float | None = None

    @classmethod
    def attach(cls, name: str) -> Lab:
        """A handle on lab ``name`` that is already up (e.g. from ``wanprobe lab up``)."""
        validate_name(name)
        state = registry.read(name)
        if state is not None and state.get("kind") == "multipath":
            raise UsageError(f"lab {name!r} is a multipath lab: use `wanprobe lab path|reroute`")
        if state is None or not forwarder_pids(name):
            raise LabError(f"lab {name!r} is not up; start it with `wanprobe lab up {name}`")
        s = LinkSettings.from_json(state.get("settings", {}))
        lab = cls(name, rtt_ms=s.rtt_ms, jitter_ms=s.jitter_ms, loss_ab=s.loss_ab,
                  loss_ba=s.loss_ba, rate_bps=s.rate_bps, mtu=s.mtu,
                  black_hole_mtu=s.black_hole_mtu, bleach_dscp=s.bleach_dscp,
                  reorder=s.reorder, offload=state.get("offload", True),
                  persistent=state.get("persistent", True))
        lab.settings = s.validated()   # every field, one-way delays and queues included
        lab.profile = state.get("profile")
        lab._started = state.get("started_unix")
        lab.offset_ns = state.get("calibration_offset_ns", 0)
        return lab

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def status(self) -> str:
        """``"up"`` (live forwarder), ``"stale"`` (leftovers without one) or ``"down"``."""
        alive = forwarder_pids(self.name)
        state = registry.read(self.name) or {}
        if state.get("kind") == "multipath":   # multipath.py's lab of this name: never clean it
            return "up" if forwarder_pids(f"{self.name}-p0") else "stale"
        ns_present = netns.exists(self.a.name) or netns.exists(self.b.name)
        if alive and netns.exists(self.a.name) and netns.exists(self.b.name):
            return "up"
        if alive or ns_present or registry.read(self.name) is not None:
            return "stale"
        return "down"

    def up(self) -> Lab:
        """Create the lab (see module docstring). Raises WanprobeError; leaves nothing half-made."""
        require_root()
        state = self.status()
        if state == "up":
            raise LabError(f"lab {self.name!r} is already up; run `wanprobe lab down {self.name}`")
        if state == "stale":
            self.down()
        with down_on_error(self.down):
            netns.create(self.a.name)
            netns.create(self.b.name)
            self._start_forwarder()
            self._configure()
            if self.calibrate:
                self._calibrate()
            registry.write(self.name, self._state())
        return self

    def down(self) -> None:
        """Remove forwarder, namespaces (with their devices and processes) and registry entry."""
        procs = [self._proc] if self._proc is not None else []
        self._proc, self._started = None, None
        tear_down([self.name], procs, (self.a.name, self.b.name), [self.name])

    # -- live changes ----------------------------------------------------------------------
    def update(self, **changes) -> LinkSettings:
        """Change impairments while the lab runs, e.g. ``lab.update(loss_ab=0.02)``.

        Keys: the LinkSettings fields plus ``loss`` (both directions); ``rtt_ms`` and the
        one-way ``delay_ab_ms``/``delay_ba_ms`` combine as :meth:`LinkSettings.with_delays`
        says. Validated first.
        """
        if "mtu" in changes:
            raise UsageError("mtu cannot change on a running lab; bring it up again")
        new = self.settings.changed(**changes)
        self._control({"op": "update", "settings": new.to_json()})
        if (new.rate_bps, new.rtt_ms) != (self.settings.rate_bps, self.settings.rtt_ms):
            for ep in (self.a, self.b):
                netns.tc_batch(ep.name, shaping.tbf_commands(ep.ifname, new.rate_bps, new.rtt_ms))
        self.settings = new
        registry.write(self.name, self._state())
        return new

    def stats(self) -> dict:
        """Forwarder counters per direction (packets, segments, lost, black_holed, ...)."""
        return self._control({"op": "stats"})["stats"]

    # -- internals -------------------------------------------------------------------------
    def _state(self) -> dict:
        if self._started is None:
            self._started = time.time()
        pids = forwarder_pids(self.name)
        return {"name": self.name, "profile": self.profile, "ns_a": self.a.name,
                "ns_b": self.b.name, "addr_a": self.a.addr, "addr_b": self.b.addr,
                "ifname": IFNAME, "forwarder_pid": pids[0] if pids else None,
                "settings": self.settings.to_json(), "offload": self.offload,
                "persistent": self.persistent, "calibration_offset_ns": self.offset_ns,
                "started_unix": self._started}

    def _start_forwarder(self) -> None:
        self._proc = start_forwarder(self.name, self.a.name, self.b.name, IFNAME, self.settings,
                                     offload=self.offload, persistent=self.persistent)

    def _configure(self) -> None:
        s = self.settings
        for ep in (self.a, self.b):
            netns.batch(ep.name, [
                f"addr add {ep.addr} peer {ep.peer_addr}/32 dev {ep.ifname}",
                f"link set {ep.ifname} mtu {s.mtu} txqueuelen 1000 up",
            ])
            netns.tc_batch(ep.name, shaping.tbf_commands(ep.ifname, s.rate_bps, s.rtt_ms))

    def _calibrate(self) -> None:
        """Measure the lab's own RTT overhead and subtract it (see calibrate.py)."""
        s = self.settings
        if s.rtt_ms <= 0 or (s.rate_bps is not None and s.rate_bps < 1e6):
            return
        clean = replace(s, loss_ab=0.0, loss_ba=0.0, reorder=0.0, jitter_ms=0.0)
        if clean != s:
            self._control({"op": "update", "settings": clean.to_json()})
        try:
            rtts = calibrate.measure_rtts_ns(self.a.name, self.b.addr,
                                             timeout_s=s.rtt_ms / 1e3 + 4 * s.jitter_ms / 1e3 + 0.3)
        finally:
            if clean != s:
                self._control({"op": "update", "settings": s.to_json()})
        if len(rtts) >= 8:
            self.offset_ns = calibrate.offset_ns(rtts, s.rtt_ms)
            self._control({"op": "offset", "offset_ns": self.offset_ns})

    def _control(self, request: dict, timeout_s: float = 3.0) -> dict:
        return control(self.name, request, timeout_s)


def tear_down(forwarders: Iterable[str], procs: Sequence[subprocess.Popen],
              namespaces: Iterable[str], entries: Iterable[str]) -> None:
    """Every lab's ``down``: stop the named forwarders and the processes this one started,
    delete the namespaces (with their devices and processes) and the registry entries. Every
    namespace is tried; the first that could not be deleted is raised after. Idempotent."""
    pids = {pid for name in forwarders for pid in forwarder_pids(name)}
    pids |= {p.pid for p in procs if p.poll() is None}
    netns.terminate(sorted(pids))
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=1)
    errors = []
    for ns in namespaces:
        try:
            netns.delete(ns)
        except LabError as exc:
            errors.append(exc)
    for name in entries:
        registry.remove(name)
    if errors:
        raise errors[0]


def start_forwarder(name: str, ns_a: str, ns_b: str, ifname: str, settings: LinkSettings, *,
                    offload: bool = True, persistent: bool = False) -> subprocess.Popen:
    """Start a delay-line forwarder between TUN ``ifname`` in ``ns_a`` and in ``ns_b``; return
    once it says ``ready`` (raise LabError otherwise). Its control socket is the registry's
    ``control_path(name)``; a non-persistent one dies with this process."""
    registry.REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", FORWARDER_MODULE, "--name", name, "--ns-a", ns_a,
            "--ns-b", ns_b, "--ifname", ifname, "--control", str(registry.control_path(name)),
            "--settings", json.dumps(settings.to_json())]
    if not offload:
        argv.append("--no-offload")
    if not persistent:
        argv += ["--owner-pid", str(os.getpid())]
    with open(registry.log_path(name), "ab") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 15.0)
    line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        with contextlib.suppress(OSError):
            proc.kill()
        detail = line.removeprefix("error: ") or "did not start within 15 s"
        raise LabError(f"lab {name!r}: delay-line forwarder failed: {detail}")
    return proc


def control(name: str, request: dict, timeout_s: float = 3.0) -> dict:
    """Send one request to the forwarder of ``name`` over its control socket; its reply."""
    path = registry.control_path(name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(f"\0wanprobe-lab-{os.getpid()}-{id(sock)}-{time.monotonic_ns()}")
        sock.settimeout(timeout_s)
        try:
            sock.sendto(json.dumps(request).encode(), str(path))
            reply = json.loads(sock.recv(65536))
        except (OSError, ValueError) as exc:
            raise LabError(f"lab {name!r} is not running (forwarder: {exc})") from None
    if not reply.get("ok"):
        raise LabError(f"lab {name!r}: {reply.get('error', 'request refused')}")
    return reply


def list_labs() -> list[dict]:
    """Labs known to the registry plus stray lab namespaces, with their status."""
    names = set(registry.names())
    if netns.NETNS_DIR.is_dir():
        for entry in netns.NETNS_DIR.iterdir():
            n = entry.name
            if n.startswith(NS_PREFIX) and n.endswith(("-a", "-b")):
                names.add(n[len(NS_PREFIX):-2])
    out = []
    for n in sorted(names):
        state = registry.read(n) or {"name": n}
        if state.get("kind") == "multipath":  # multipath.py: one forwarder per path
            alive = all(forwarder_pids(f"{n}-p{i}") for i in range(len(state.get("paths", []))))
            state["status"] = "up" if alive else "stale"
            state.update(ns_a=state["namespaces"]["a"], ns_b=state["namespaces"]["b"])
            out.append(state)
            continue
        try:
            state["status"] = Lab(n, rtt_ms=0).status()
        except UsageError:
            state["status"] = "stale"
        out.append(state)
    return out
