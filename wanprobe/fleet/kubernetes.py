"""``wanprobe fleet kubernetes``: the fleet as Kubernetes manifests (one YAML stream).

What is rendered, per Kubernetes' conventions for per-node network agents (Goldpinger and
node_exporter ship the same shape):

- a Namespace for the agent; ``hostNetwork``, host paths and ``NET_RAW`` lie outside the Pod
  Security Standards' *baseline* level (https://kubernetes.io/docs/concepts/security/
  pod-security-standards/), so it is labelled ``enforce: privileged`` although no container in
  it is privileged;
- a ConfigMap with the mesh file and the daemon config (the HMAC key is never in it: the
  config names a file, mounted from the Secret the operator creates);
- one DaemonSet per site, scheduled by a node label (``--site-label``, whose value is the
  site's name): the pod carries the site as a label, which the ServiceMonitor turns into the
  ``site`` target label ``fleet targets`` gives file_sd users;
- a headless Service, a ServiceMonitor and a PrometheusRule for the Prometheus operator
  (monitoring.coreos.com/v1), the rule groups exactly those of ``wanprobe fleet rules``;
- with ``--web-config-secret`` and ``--tls-secret``: the listener behind TLS (and basic auth,
  client certificates, as the operator's web config says): both Secrets projected into the
  pod, the daemon config naming the web config, HTTPS probes on the open ``/healthz``, and a
  ServiceMonitor with ``scheme: https``, ``tlsConfig`` and ``basicAuth`` from Secrets;
- with ``--tuner``: a second namespace (PSA ``privileged``: ``NET_ADMIN`` is only allowed
  there, kubernetes/kubernetes#106107) holding the tuner DaemonSet, the plan it may apply and
  a config without the key.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tuners.registry import AUTO_APPLY_TUNERS
from wanprobe import __version__
from wanprobe.errors import ConfigError, UsageError, shown
from wanprobe.fleet import kube_pods as pods
from wanprobe.mesh.topology import Mesh, select_peers
from wanprobe.userfiles import read_text

MONITORING = "monitoring.coreos.com/v1"
SITE_POD_LABEL = "wanprobe.io/site"
# A ConfigMap holds at most 1 MiB (https://kubernetes.io/docs/concepts/configuration/configmap/)
MAX_CONFIGMAP_BYTES = 1024 * 1024 - 4096
# RFC 1123 label (names of DaemonSets, namespaces) and a label value (Kubernetes object names
# and labels: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")


@dataclass(frozen=True)
class KubeSettings:
    """What the operator chooses; the rest comes from the mesh file."""

    namespace: str = "wanprobe"
    tuner_namespace: str = "wanprobe-tuner"
    image: str = f"wanprobe:{__version__}"
    key_secret: str | None = None          # an existing Secret holding hmac.key
    site_label: str = "topology.kubernetes.io/region"
    site: str | None = None                # only this site's DaemonSet (a cluster per site)
    job: str = "wanprobe"                  # the scrape job the rules' `up{job=...}` names
    monitor_labels: dict[str, str] = field(default_factory=dict)  # ruleSelector etc.
    scrape_interval: str = "30s"
    plan_json: str | None = None           # --tuner: the signed-off plan
    # a secured listener: Secrets the operator creates in `namespace`
    web_config_secret: str | None = None   # web-config.yml (exporter-toolkit format)
    tls_secret: str | None = None          # kubernetes.io/tls: the listener's certificate
    ca_secret: str | None = None           # ca.crt Prometheus verifies it with (default tls_secret)
    server_name: str | None = None         # the name in the certificate (default: the Service's)
    client_cert_secret: str | None = None  # kubernetes.io/tls: Prometheus's client certificate
    basic_auth_secret: str | None = None   # keys `username` and `password`

    @property
    def tls(self) -> bool:
        return self.tls_secret is not None

    @property
    def tls_server_name(self) -> str:
        """The headless Service's DNS name: one certificate for every node (Prometheus scrapes
        the pod IP, which with hostNetwork is each node's own)."""
        return self.server_name or f"wanprobe-agent.{self.namespace}.svc"


def check_settings(s: KubeSettings) -> None:
    """Each option in the form Kubernetes accepts, refused with one line before rendering."""
    for option, value in (("--namespace", s.namespace), ("--tuner-namespace", s.tuner_namespace),
                          ("--key-secret", s.key_secret or "x")):
        if not _DNS_LABEL.fullmatch(value):
            raise UsageError(f"{option}: {value!r} is not a Kubernetes name (RFC 1123 label: "
                             "lower-case letters, digits and '-', at most 63)")
    if s.namespace == s.tuner_namespace:
        raise UsageError("--tuner-namespace must differ from --namespace (the tuner's "
                         "NET_ADMIN stays out of the agent's namespace)")
    if not _IMAGE.fullmatch(s.image):
        raise UsageError(f"--image: {s.image!r} is not an image reference")
    for key, value in [(s.site_label, "x"), *s.monitor_labels.items()]:
        if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise UsageError(f"label {key}={value!r} is not a Kubernetes label")
    _check_web(s)


def _check_web(s: KubeSettings) -> None:
    """The secured listener's options: Secret names, and only combinations that scrape."""
    secrets = {"--web-config-secret": s.web_config_secret, "--tls-secret": s.tls_secret,
               "--ca-secret": s.ca_secret, "--scrape-client-cert-secret": s.client_cert_secret,
               "--basic-auth-secret": s.basic_auth_secret}
    for option, value in secrets.items():
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise UsageError(f"{option}: {shown(value)} is not a Kubernetes Secret name (RFC 1123 "
                             "subdomain: lower-case letters, digits, '-' and '.', at most 253)")
    if (s.web_config_secret is None) != (s.tls_secret is None):
        raise UsageError("--web-config-secret and --tls-secret go together: the web config's "
                         "tls_server_config names the certificate (tls.crt, tls.key beside it); "
                         "without TLS the page and any password cross the network in clear")
    if not s.tls:
        given = [o for o in list(secrets)[2:] if secrets[o] is not None]
        if given or s.server_name is not None:
            raise UsageError(f"{(given or ['--server-name'])[0]} is a setting of the secured "
                             "listener: add --web-config-secret and --tls-secret")
    if s.server_name is not None and not _DNS_SUBDOMAIN.fullmatch(s.server_name):
        raise UsageError(f"--server-name: {shown(s.server_name)} is not a DNS name")


def _meta(name: str, namespace: str | None, component: str,
          extra: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "wanprobe", "app.kubernetes.io/component": component,
              "app.kubernetes.io/part-of": "wanprobe", "app.kubernetes.io/version": __version__,
              **(extra or {})}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _selector(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "wanprobe", "app.kubernetes.io/component": component}


def _namespace(name: str) -> dict[str, Any]:
    meta = _meta(name, None, "namespace")
    meta["labels"] |= {"pod-security.kubernetes.io/enforce": "privileged",
                       "pod-security.kubernetes.io/enforce-version": "latest"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def _toml(tables: dict[str, dict[str, Any]]) -> str:
    """Flat TOML tables of strings, integers, booleans and string lists (a JSON string is a
    TOML basic string, TOML 1.0 §String)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))
    return "\n".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in t.items())
                     for name, t in tables.items())


def daemon_config(mesh_name: str, metrics_port: int, *, key: bool, plan: dict | None,
                  web: bool = False) -> str:
    """The daemon's config for a pod: the mesh from the ConfigMap, /metrics on the node's
    addresses (Prometheus scrapes the pod IP, which is the node's), logfmt to stdout (journal
    priority prefixes mean nothing to a container log); with ``web`` the web config from its
    Secret and /healthz open for the kubelet's probes (they carry no credentials); every other
    table at its defaults, which are the schedule the footprint was measured with."""
    daemon: dict[str, Any] = {
        "state_dir": pods.STATE_DIR, "mesh_file": f"{pods.CONFIG_DIR}/{mesh_name}",
        "metrics_listen": f"0.0.0.0:{metrics_port}",
        "reflector_listen": [f"0.0.0.0:{pods.STAMP_PORT}"], "log_format": "logfmt"}
    if key:
        daemon["hmac_key_file"] = f"{pods.KEY_DIR}/{pods.KEY_FILE_NAME}"
    if web:
        daemon["web_config_file"] = f"{pods.WEB_DIR}/{pods.WEB_CONFIG_NAME}"
        daemon["web_healthz_open"] = True
    tables: dict[str, dict[str, Any]] = {"daemon": daemon}
    if plan is not None:
        tables["auto_apply"] = plan
    return _toml(tables)


def _plan_gate(plan_json: str) -> dict[str, Any]:
    """The [auto_apply] table for a plan: its sha256 (the sign-off) and the tuners it uses."""
    try:
        plan = json.loads(plan_json)
        tuners = sorted({str(c["tuner"]) for c in plan["changes"]})
    except (ValueError, KeyError, TypeError):
        raise UsageError("--plan: not a wanprobe plan (JSON with changes[], each naming its "
                         "tuner; make one with `wanprobe tune plan`)") from None
    if not tuners:
        raise UsageError("--plan: the plan changes nothing")
    unknown = [t for t in tuners if t not in AUTO_APPLY_TUNERS]
    if unknown:
        raise UsageError(f"--plan: tuner {unknown[0]!r} cannot be applied unattended (auto_apply "
                         f"knows {', '.join(AUTO_APPLY_TUNERS)})")
    return {"enabled": True, "tuners": tuners, "plan": f"{pods.PLAN_DIR}/{pods.PLAN_FILE_NAME}",
            "plan_sha256": hashlib.sha256(plan_json.encode()).hexdigest()}


def _configmap(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIGMAP_BYTES:
        raise UsageError(f"ConfigMap {name}: {size:,} bytes, above Kubernetes' 1 MiB limit")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace, "config"),
            "data": data}


def _object_name(site: str) -> str:
    """``wanprobe-<site>`` as an RFC 1123 label; a short hash keeps altered names apart."""
    base = re.sub(r"[^a-z0-9-]+", "-", site.lower()).strip("-")[:40] or "site"
    if base != site:
        base += f"-{zlib.crc32(site.encode()):08x}"
    return f"wanprobe-{base}"


def _site_ports(mesh: Mesh, sites: list[str]) -> int:
    """The one metrics port of the rendered hosts (a DaemonSet has one port; so does the
    ConfigMap's config)."""
    ports = {h.metrics_port for h in mesh.hosts if h.site in sites}
    if len(ports) != 1:
        raise UsageError(f"the mesh gives the rendered hosts {len(ports)} metrics ports "
                         f"({', '.join(map(str, sorted(ports)))}); on Kubernetes they share one "
                         "DaemonSet port: use one metrics_port (or --site per port)")
    return ports.pop()


def sessions_per_daemon(mesh: Mesh) -> int:
    """The most probe sessions any daemon of the mesh runs: its peers × the mesh's methods."""
    return max((len(select_peers(mesh, h)) for h in mesh.hosts), default=0) * len(mesh.methods)


def _daemonset(name: str, namespace: str, component: str, site: str | None,
               pod: dict[str, Any]) -> dict[str, Any]:
    extra = {SITE_POD_LABEL: site} if site is not None else {}
    match = _selector(component) | extra
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": _meta(name, namespace, component, extra),
            "spec": {"selector": {"matchLabels": match},
                     "updateStrategy": {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxUnavailable": 1}},
                     "template": {"metadata": {"labels": _meta(name, None, component,
                                                               extra)["labels"]},
                                  "spec": pod}}}


def _monitoring(s: KubeSettings, port: int, rule_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Service, ServiceMonitor (site/host/job target labels as `fleet targets` gives them)
    and the PrometheusRule holding `fleet rules`' groups unchanged."""
    pod_site = "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", SITE_POD_LABEL)
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": _meta("wanprobe-agent", s.namespace, "agent"),
               "spec": {"clusterIP": "None", "selector": _selector("agent"),
                        "ports": [{"name": "metrics", "port": port, "targetPort": "metrics",
                                   "protocol": "TCP"}]}}
    monitor = {"apiVersion": MONITORING, "kind": "ServiceMonitor",
               "metadata": _meta("wanprobe", s.namespace, "agent", s.monitor_labels),
               "spec": {"selector": {"matchLabels": _selector("agent")},
                        "namespaceSelector": {"matchNames": [s.namespace]},
                        "endpoints": [{"port": "metrics", "path": "/metrics",
                                       "interval": s.scrape_interval,
                                       "relabelings": [
                                           {"action": "replace", "sourceLabels": [pod_site],
                                            "targetLabel": "site"},
                                           {"action": "replace",
                                            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                            "targetLabel": "host"},
                                           {"action": "replace", "targetLabel": "job",
                                            "replacement": s.job}]}]}}
    monitor["spec"]["endpoints"][0] |= _endpoint_security(s)
    rule = {"apiVersion": MONITORING, "kind": "PrometheusRule",
            "metadata": _meta("wanprobe", s.namespace, "rules", s.monitor_labels),
            "spec": rule_doc}
    return [service, monitor, rule]


def _endpoint_security(s: KubeSettings) -> dict[str, Any]:
    """A ServiceMonitor endpoint's ``scheme``, ``tlsConfig`` and ``basicAuth``
    (monitoring.coreos.com/v1 Endpoint, SafeTLSConfig, BasicAuth): every secret a
    ``secretKeyRef``-style selector into the ServiceMonitor's namespace, read by the operator."""
    if not s.tls:
        return {}
    tls: dict[str, Any] = {"ca": {"secret": {"name": s.ca_secret or s.tls_secret,
                                             "key": "ca.crt"}},
                           "serverName": s.tls_server_name}
    if s.client_cert_secret is not None:
        tls["cert"] = {"secret": {"name": s.client_cert_secret, "key": "tls.crt"}}
        tls["keySecret"] = {"name": s.client_cert_secret, "key": "tls.key"}
    out: dict[str, Any] = {"scheme": "https", "tlsConfig": tls}
    if s.basic_auth_secret is not None:
        out["basicAuth"] = {"username": {"name": s.basic_auth_secret, "key": "username"},
                            "password": {"name": s.basic_auth_secret, "key": "password"}}
    return out


def _tuner(s: KubeSettings, sites: list[str], mesh_name: str, mesh_text: str,
           port: int, gate: dict[str, Any]) -> list[dict[str, Any]]:
    """The tuner's namespace, its key-less config and plan, and its DaemonSet on the sites'
    nodes."""
    assert s.plan_json is not None
    ns = s.tuner_namespace
    config = {"wanprobe.toml": daemon_config(mesh_name, port, key=False, plan=gate),
              mesh_name: mesh_text}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": s.site_label, "operator": "In", "values": sites}]}]}}
    return [_namespace(ns), _configmap("wanprobe-config", ns, config),
            _configmap("wanprobe-plan", ns, {pods.PLAN_FILE_NAME: s.plan_json}),
            _daemonset("wanprobe-tuner", ns, "tuner", None,
                       pods.tuner_pod(image=s.image, node_affinity=affinity))]


def manifests(mesh: Mesh, mesh_name: str, mesh_text: str, s: KubeSettings,
              rule_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object, in the order ``kubectl apply`` needs them (namespaces first)."""
    check_settings(s)
    if s.site is not None and s.site not in mesh.sites:
        raise UsageError(f"--site: {s.site!r} is not a site of the mesh ({', '.join(mesh.sites)})")
    sites = [x for x in mesh.sites if s.site in (None, x)
             and any(h.site == x for h in mesh.hosts)]
    if not sites:
        raise UsageError("the mesh has no hosts to run an agent on")
    for site in sites:
        if not _LABEL_VALUE.fullmatch(site):
            raise UsageError(f"site {site!r} cannot be a node label value (letters, digits, "
                             "'-', '_', '.', at most 63): rename it in the mesh")
    port = _site_ports(mesh, sites)
    gate = _plan_gate(s.plan_json) if s.plan_json is not None else None
    resources = pods.agent_resources(sessions_per_daemon(mesh))
    config = {"wanprobe.toml": daemon_config(mesh_name, port, key=bool(s.key_secret), plan=gate,
                                             web=s.tls),
              mesh_name: mesh_text}
    web = (pods.web_volume(s.web_config_secret, s.tls_secret)
           if s.web_config_secret and s.tls_secret else None)
    out = [_namespace(s.namespace), _configmap("wanprobe-config", s.namespace, config)]
    if gate is not None:
        out.append(_configmap("wanprobe-plan", s.namespace, {pods.PLAN_FILE_NAME: s.plan_json}))
    for site in sites:
        pod = pods.agent_pod(image=s.image, metrics_port=port, resources=resources,
                             key_secret=s.key_secret, plan=gate is not None,
                             node_selector={"kubernetes.io/os": "linux", s.site_label: site},
                             web=web)
        out.append(_daemonset(_object_name(site), s.namespace, "agent", site, pod))
    out += _monitoring(s, port, rule_doc)
    if gate is not None:
        out += _tuner(s, sites, mesh_name, mesh_text, port, gate)
    return out


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader refusing anchors/aliases: a rules file needs none, and a nest of aliases
    ("billion laughs") would be written out in full."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases (*name) are not accepted in a rules file")
        return super().compose_node(parent, index)


def load_rules(path: Path) -> dict[str, Any]:
    """A rules file as ``fleet rules`` writes it: ``groups`` of named ``rules``, each a record
    or an alert with an expr. One ConfigError line for anything else."""
    text = read_text(path, "rules file", 4 * 2**20)
    try:
        doc = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"rules file {path}: not YAML: {str(exc).splitlines()[0]}") from None
    groups = doc.get("groups") if isinstance(doc, dict) else None
    ok = isinstance(groups, list) and groups and all(
        isinstance(g, dict) and isinstance(g.get("name"), str) and isinstance(g.get("rules"), list)
        and all(isinstance(r, dict) and isinstance(r.get("expr"), str)
                and isinstance(r.get("record") or r.get("alert"), str) for r in g["rules"])
        for g in groups)
    if not ok:
        raise ConfigError(f"rules file {path}: not Prometheus rules (groups: [{{name, rules: "
                          "[{record|alert, expr}]}]); write one with `wanprobe fleet rules`")
    return doc


def render(mesh_path: Path, s: KubeSettings, rules_path: Path | None,
           plan_path: Path | None) -> str:
    """The YAML stream for ``wanprobe fleet kubernetes``."""
    from wanprobe.fleet.rules import RuleSettings, rule_groups
    from wanprobe.fleet.yaml_text import dumps_all
    from wanprobe.mesh.topology import load_mesh

    mesh = load_mesh(mesh_path)
    mesh_name = "mesh.json" if mesh_path.suffix == ".json" else "mesh.toml"
    mesh_text = read_text(mesh_path, "mesh file", MAX_CONFIGMAP_BYTES)
    if plan_path is not None:
        s = replace(s, plan_json=read_text(plan_path, "plan", MAX_CONFIGMAP_BYTES))
    rule_doc = load_rules(rules_path) if rules_path else rule_groups(RuleSettings(job=s.job))
    return dumps_all(manifests(mesh, mesh_name, mesh_text, s, rule_doc))
