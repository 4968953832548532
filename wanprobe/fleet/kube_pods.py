"""The pod templates of ``wanprobe fleet kubernetes``: the agent (one DaemonSet per site) and the
opt-in tuner, with their security contexts and resources.

The agent mirrors ``systemd/wanprobe.service``: the node's own network (``hostNetwork``, so it
measures the path training traffic takes), every capability dropped but ``NET_RAW`` (ICMP
probes need a raw socket) and ``NET_BIND_SERVICE`` when a port below 1024 is bound (the STAMP
reflector's 862, RFC 8762 §4.1), no privilege escalation, a read-only root filesystem and the
runtime's default seccomp profile. It runs as uid 0 *inside* the container because Kubernetes
gives a non-root container's process no capability at all (only the bounding set; there are no
ambient capabilities: kubernetes/kubernetes#56374), while ``NoNewPrivs`` and the empty
capability set keep uid 0 from meaning root. The tuner mirrors ``systemd/wanprobe-tune.*``:
``NET_ADMIN`` only, in its own namespace, applying the signed-off plan when the agent asks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Measured by bench/daemon_footprint.py (docs/fleet.md §6): the daemon probing N peers once a
# second (a session of 10 probes every 10 s, the default [probe] schedule) on the 2-core
# development VM. (sessions, resident memory MiB, CPU % of one core — the top of the measured
# range). tests/test_fleet_kubernetes.py checks these against the table in the docs.
FOOTPRINT = ((200, 54.0, 1.3), (1000, 79.0, 5.5))
# systemd/wanprobe.service's MemoryMax: the bound the project already runs the daemon under
MEMORY_LIMIT_FLOOR_MIB = 256
# one core: a scheduled throughput test runs the Python data path flat out on one core
CPU_LIMIT_MILLI = 1000

CONFIG_DIR = "/etc/wanprobe"
KEY_DIR = "/etc/wanprobe/key"
KEY_FILE_NAME = "hmac.key"
PLAN_DIR = "/etc/wanprobe/plan"
# the web config (exporter-toolkit format) and the listener's certificate, from two Secrets
# projected into one directory: the web config names `tls.crt`/`tls.key` relative to itself
WEB_DIR = "/etc/wanprobe/web"
WEB_CONFIG_NAME = "web-config.yml"
TLS_KEYS = ("tls.crt", "tls.key")   # a kubernetes.io/tls Secret (cert-manager writes these)
PLAN_FILE_NAME = "plan.json"
STATE_DIR = "/var/lib/wanprobe"
TUNE_STATE_DIR = "/var/lib/wanprobe-tune"
STAMP_PORT = 862


@dataclass(frozen=True)
class Resources:
    """Requests and limits of the agent, and the figures they came from."""

    sessions: int
    cpu_request_milli: int
    memory_request_mib: int
    memory_limit_mib: int
    source: str

    def to_k8s(self) -> dict[str, Any]:
        return {"requests": {"cpu": f"{self.cpu_request_milli}m",
                             "memory": f"{self.memory_request_mib}Mi"},
                "limits": {"cpu": f"{CPU_LIMIT_MILLI}m", "memory": f"{self.memory_limit_mib}Mi"}}


def _interpolate(n: float, column: int) -> float:
    """Linear in the number of sessions between the measured points, the first one's figure
    below it (fewer peers cost less; the smallest measurement is the safe floor)."""
    (n0, *a), (n1, *b) = FOOTPRINT
    y0, y1 = a[column], b[column]
    if n <= n0:
        return y0
    return y0 + (y1 - y0) * (n - n0) / (n1 - n0)


def agent_resources(sessions: int) -> Resources:
    """Requests from the measured footprint at ``sessions`` probe sessions per daemon (peers ×
    methods); the memory limit twice the measured RSS, never below the systemd unit's."""
    rss = _interpolate(sessions, 0)
    cpu = _interpolate(sessions, 1)
    request = math.ceil(rss)
    return Resources(sessions, max(1, math.ceil(cpu * 10)), request,
                     max(MEMORY_LIMIT_FLOOR_MIB, 2 * request),
                     f"bench/daemon_footprint.py (docs/fleet.md §6) at {sessions} sessions")


def agent_capabilities(ports: list[int]) -> list[str]:
    """NET_RAW for ICMP; NET_BIND_SERVICE only if a port below 1024 is bound (capabilities(7))."""
    return ["NET_RAW"] + (["NET_BIND_SERVICE"] if any(p < 1024 for p in ports) else [])


def container_security(add: list[str]) -> dict[str, Any]:
    """Not privileged, nothing but ``add``, no escalation, read-only root, default seccomp."""
    return {"privileged": False, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "runAsUser": 0, "runAsGroup": 0,
            "runAsNonRoot": False, "capabilities": {"drop": ["ALL"], "add": add},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _host_path(name: str, path: str, kind: str = "Directory") -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _pod(containers: list[dict], volumes: list[dict], node: dict[str, Any]) -> dict[str, Any]:
    """A node agent's pod: the node's network, no API token, tolerates every taint (GPU nodes
    carry NoSchedule taints; node_exporter's chart does the same), seccomp by default."""
    return {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "tolerations": [{"operator": "Exists"}], **node,
            "containers": containers, "volumes": volumes}


def _http_probe(period_s: int, failures: int, tls: bool) -> dict[str, Any]:
    """GET /healthz; over TLS the kubelet does not verify the certificate and sends no
    credentials, so the daemon answers it unauthenticated (``web_healthz_open``)."""
    get: dict[str, Any] = {"path": "/healthz", "port": "metrics"}
    if tls:
        get["scheme"] = "HTTPS"
    return {"httpGet": get, "periodSeconds": period_s, "timeoutSeconds": 5,
            "failureThreshold": failures}


def web_volume(web_config_secret: str, tls_secret: str) -> dict[str, Any]:
    """The web config Secret (every key: ``web-config.yml`` and a client CA, if any) and the
    certificate's ``tls.crt``/``tls.key`` in one read-only directory. A projected Secret is
    updated in place, so a renewed certificate reaches the daemon without a restart."""
    return {"name": "web", "projected": {"defaultMode": 0o400, "sources": [
        {"secret": {"name": web_config_secret}},
        {"secret": {"name": tls_secret, "items": [{"key": k, "path": k} for k in TLS_KEYS]}}]}}


def agent_pod(*, image: str, metrics_port: int, resources: Resources, key_secret: str | None,
              plan: bool, node_selector: dict[str, str],
              web: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's pod spec: the daemon with the ConfigMap's config, the key Secret (if any)
    as a file, its history on the node (it outlives the pod: baselines), the web config and
    certificate (``web``, from :func:`web_volume`) and /healthz probes."""
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "state", "mountPath": STATE_DIR},
              {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [{"name": "config", "configMap": {"name": "wanprobe-config"}},
               _host_path("state", STATE_DIR, "DirectoryOrCreate"),
               {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
    if key_secret:  # the key is a file from a Secret, never a ConfigMap value
        mounts.append({"name": "key", "mountPath": KEY_DIR, "readOnly": True})
        volumes.append({"name": "key", "secret": {"secretName": key_secret, "defaultMode": 0o400,
                                                   "items": [{"key": KEY_FILE_NAME,
                                                              "path": KEY_FILE_NAME}]}})
    if plan:
        mounts.append({"name": "plan", "mountPath": PLAN_DIR, "readOnly": True})
        volumes.append({"name": "plan", "configMap": {"name": "wanprobe-plan"}})
    if web is not None:
        mounts.append({"name": "web", "mountPath": WEB_DIR, "readOnly": True})
        volumes.append(web)
    tls = web is not None
    container = {
        "name": "agent", "image": image, "imagePullPolicy": "IfNotPresent",
        "args": ["daemon", "--config", f"{CONFIG_DIR}/wanprobe.toml"],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"},
                  {"name": "stamp", "containerPort": STAMP_PORT, "protocol": "UDP"},
                  {"name": "control", "containerPort": STAMP_PORT, "protocol": "TCP"}],
        "resources": resources.to_k8s(),
        "securityContext": container_security(agent_capabilities([metrics_port, STAMP_PORT])),
        "startupProbe": _http_probe(2, 30, tls), "livenessProbe": _http_probe(30, 3, tls),
        "readinessProbe": _http_probe(10, 1, tls),
        "volumeMounts": mounts}
    return _pod([container], volumes, {"nodeSelector": node_selector})


# Mirrors systemd/wanprobe-tune.path + .service: when the agent writes apply-request.json, gate
# the plan again (--check-plan: sha256 and tuner whitelist) and apply it. /proc/sys and /sys are
# read-only inside a container, so the node's /proc/sys/net and /sys come in as host paths and
# the tuners are pointed at them (--proc-root/--sys-root).
TUNER_LOOP = f"""\
req={STATE_DIR}/apply-request.json
last=$(stat -c %Y "$req" 2>/dev/null || echo none)
while sleep 15; do
  now=$(stat -c %Y "$req" 2>/dev/null || echo none)
  [ "$now" = "$last" ] && continue
  last=$now
  [ "$now" = none ] && continue
  wanprobe daemon --check-plan --config {CONFIG_DIR}/wanprobe.toml &&
  wanprobe tune apply {PLAN_DIR}/{PLAN_FILE_NAME} --yes --state-dir {TUNE_STATE_DIR} \\
    --proc-root /host/proc --sys-root /host/sys
done
"""


def tuner_pod(*, image: str, node_affinity: dict[str, Any]) -> dict[str, Any]:
    """The opt-in tuner: NET_ADMIN only, the node's /proc/sys/net and /sys writable through
    host paths, the agent's state dir read-only (its apply requests)."""
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
              {"name": "requests", "mountPath": STATE_DIR, "readOnly": True},
              {"name": "journal", "mountPath": TUNE_STATE_DIR},
              {"name": "proc-sys-net", "mountPath": "/host/proc/sys/net"},
              {"name": "sys", "mountPath": "/host/sys"},
              {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [{"name": "config", "configMap": {"name": "wanprobe-config"}},
               {"name": "plan", "configMap": {"name": "wanprobe-plan"}},
               _host_path("requests", STATE_DIR, "DirectoryOrCreate"),
               _host_path("journal", TUNE_STATE_DIR, "DirectoryOrCreate"),
               _host_path("proc-sys-net", "/proc/sys/net"), _host_path("sys", "/sys"),
               {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
    container = {
        "name": "tuner", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", TUNER_LOOP],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        # not measured: a short `wanprobe tune apply` run now and then; the limit is the
        # daemon's MemoryMax
        "resources": {"requests": {"cpu": "5m", "memory": "32Mi"},
                      "limits": {"cpu": "500m", "memory": f"{MEMORY_LIMIT_FLOOR_MIB}Mi"}},
        "securityContext": container_security(["NET_ADMIN"]),
        "volumeMounts": mounts}
    return _pod([container], volumes, {"affinity": {"nodeAffinity": node_affinity}})
