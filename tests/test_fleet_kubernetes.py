"""`wanprobe fleet kubernetes` (issue 24): the manifests pass kubernetes-validate's strict
schemas (offline), the agent is unprivileged with only the named capabilities, the tuner alone
holds NET_ADMIN in its own privileged namespace, the PrometheusRule is `fleet rules`' document,
the HMAC key stays in a Secret, resources come from the measured footprint, and the
Containerfile builds what the manifests run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest
import yaml
from clirun import invoke, one_line_error
from conftest import REPO, require, require_tool

from wanprobe.daemon.config import parse_config
from wanprobe.fleet import kube_pods
from wanprobe.mesh.topology import parse_mesh

MESH = REPO / "systemd" / "mesh.toml.example"
AGENT_CAPS = ["NET_RAW", "NET_BIND_SERVICE"]


def kv():
    try:
        import kubernetes_validate
    except ImportError:
        require("needs kubernetes-validate (pip install -e .[test])")
    return kubernetes_validate


def render(*args: str) -> list[dict]:
    r = invoke("fleet", "kubernetes", "--mesh", MESH, *args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d is not None]


@pytest.fixture
def plan(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"version": 1, "changes": [
        {"tuner": "sysctl", "key": "net.ipv4.tcp_rmem", "value": "4096 131072 67108864"}]}))
    return p


@pytest.fixture
def full(plan) -> list[dict]:
    """Everything switched on: key Secret, tuner, selector labels."""
    return render("--key-secret", "wanprobe-hmac", "--tuner", "--plan", str(plan),
                  "--monitor-label", "release=kube-prometheus-stack")


def kinds(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_builtin_objects_pass_strict_schemas_and_the_validator_can_fail(full):
    k = kv()
    version = k.utils.latest_version()
    builtin = [d for d in full if "monitoring.coreos.com" not in d["apiVersion"]]
    assert {d["kind"] for d in builtin} == {"Namespace", "ConfigMap", "DaemonSet", "Service"}
    for doc in builtin:
        k.validate(doc, version, strict=True)
    # the schemas are not vacuous: an unknown field and a wrong type are refused
    bad = json.loads(json.dumps(kinds(full, "DaemonSet")[0]))
    bad["spec"]["template"]["spec"]["hostNetwrk"] = True
    with pytest.raises(k.ValidationError):
        k.validate(bad, version, strict=True)
    bad = json.loads(json.dumps(kinds(full, "DaemonSet")[0]))
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9862"
    with pytest.raises(k.ValidationError):
        k.validate(bad, version, strict=True)
    # the operator's kinds have no schema there: checked by shape (and promtool) below
    with pytest.raises(k.SchemaNotFoundError):
        k.validate(kinds(full, "ServiceMonitor")[0], version, strict=True)


def test_cli_validator_reads_the_stream(tmp_path, full):
    kv()
    path = tmp_path / "all.yaml"
    r = invoke("fleet", "kubernetes", "--mesh", MESH)
    path.write_text(r.stdout)
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.count("passed for resource") + out.stdout.count("passed for resource") == 6


def _containers(ds: dict) -> list[dict]:
    pod = ds["spec"]["template"]["spec"]
    assert not pod.get("initContainers") and not pod.get("hostPID") and not pod.get("hostIPC")
    return pod["containers"]


def test_agent_is_unprivileged_with_only_the_named_capabilities(full):
    agents = [d for d in kinds(full, "DaemonSet") if d["metadata"]["namespace"] == "wanprobe"]
    assert [d["metadata"]["name"] for d in agents] == [
        "wanprobe-taipei", "wanprobe-tokyo", "wanprobe-uswest"]
    for ds in agents:
        pod = ds["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
        (c,) = _containers(ds)
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"], "add": AGENT_CAPS}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        probes = {k: c[k]["httpGet"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
        assert all(p == {"path": "/healthz", "port": "metrics"} for p in probes.values())
        ports = {(p["name"], p["containerPort"], p["protocol"]) for p in c["ports"]}
        assert ports == {("metrics", 9862, "TCP"), ("stamp", 862, "UDP"), ("control", 862, "TCP")}
    # NET_BIND_SERVICE is there for port 862 only: without a port below 1024 it goes
    assert kube_pods.agent_capabilities([9862, 8620]) == ["NET_RAW"]


def test_tuner_alone_holds_net_admin_in_its_privileged_namespace(full):
    namespaces = {d["metadata"]["name"]: d["metadata"]["labels"] for d in kinds(full, "Namespace")}
    assert namespaces["wanprobe-tuner"]["pod-security.kubernetes.io/enforce"] == "privileged"
    added = {(d["metadata"]["namespace"], d["metadata"]["name"]):
             c["securityContext"]["capabilities"]["add"]
             for d in kinds(full, "DaemonSet") for c in _containers(d)}
    assert added.pop(("wanprobe-tuner", "wanprobe-tuner")) == ["NET_ADMIN"]
    assert added and all(caps == AGENT_CAPS for caps in added.values())
    (tuner,) = _containers(kinds(full, "DaemonSet")[-1])
    assert tuner["securityContext"]["privileged"] is False
    assert subprocess.run(["sh", "-n", "-c", tuner["command"][2]]).returncode == 0
    # without --tuner nothing holds NET_ADMIN and no second namespace is rendered
    plain = render()
    assert [d["metadata"]["name"] for d in kinds(plain, "Namespace")] == ["wanprobe"]
    assert "NET_ADMIN" not in json.dumps(plain)


def test_prometheusrule_is_exactly_fleet_rules(tmp_path, full):
    (rule,) = kinds(full, "PrometheusRule")
    default = invoke("fleet", "rules")
    assert rule["spec"] == yaml.safe_load(default.stdout)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    custom = invoke("fleet", "rules", "--loss-slo", "2%", "--window", "10m", "--job", "wp")
    (tmp_path / "rules.yml").write_text(custom.stdout)
    docs = render("--rules", str(tmp_path / "rules.yml"), "--job", "wp")
    (rule,) = kinds(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(custom.stdout)
    promtool = require_tool("promtool")
    (tmp_path / "spec.yml").write_text(yaml.safe_dump(rule["spec"]))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "spec.yml")],
                       capture_output=True, text=True)
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert r.returncode == 0 and f"SUCCESS: {count} rules found" in r.stdout, r.stdout + r.stderr
    # the scrape job the rules' `up{job=...}` names is the one the ServiceMonitor sets
    relabel = kinds(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]["relabelings"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "wp"} in relabel


def test_sites_from_node_labels_and_target_labels_like_fleet_targets(full):
    (monitor,) = kinds(full, "ServiceMonitor")
    relabel = {r["targetLabel"]: r.get("sourceLabels") for r in
               monitor["spec"]["endpoints"][0]["relabelings"]}
    assert relabel["site"] == ["__meta_kubernetes_pod_label_wanprobe_io_site"]
    assert relabel["host"] == ["__meta_kubernetes_pod_node_name"]
    for ds in kinds(full, "DaemonSet")[:3]:
        site = ds["metadata"]["name"].removeprefix("wanprobe-")
        pod = ds["spec"]["template"]
        assert pod["spec"]["nodeSelector"]["topology.kubernetes.io/region"] == site
        assert pod["metadata"]["labels"]["wanprobe.io/site"] == site
    one = render("--site", "tokyo", "--site-label", "example.net/dc")
    (ds,) = kinds(one, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"]["example.net/dc"] == "tokyo"


def test_hmac_key_only_in_a_secret_and_the_config_loads(tmp_path, full):
    cm = next(d for d in kinds(full, "ConfigMap") if d["metadata"]["namespace"] == "wanprobe"
              and d["metadata"]["name"] == "wanprobe-config")
    text = cm["data"]["wanprobe.toml"]
    assert tomllib.loads(text)["daemon"]["hmac_key_file"] == "/etc/wanprobe/key/hmac.key"
    (ds, *_) = kinds(full, "DaemonSet")
    secret = [v for v in ds["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert secret == [{"name": "key", "secret": {"secretName": "wanprobe-hmac", "defaultMode": 256,
                                                 "items": [{"key": "hmac.key",
                                                            "path": "hmac.key"}]}}]
    assert not kinds(full, "Secret")  # the operator creates it; nothing renders a key
    # the tuner's namespace cannot mount the agent's Secret: its config names no key
    tuner_cm = next(d for d in kinds(full, "ConfigMap")
                    if d["metadata"]["namespace"] == "wanprobe-tuner"
                    and d["metadata"]["name"] == "wanprobe-config")
    assert "hmac" not in tuner_cm["data"]["wanprobe.toml"]
    # the config the pod reads is one `wanprobe daemon` accepts, with the mesh beside it
    key = tmp_path / "hmac.key"
    key.write_text("k" * 32)
    data = tomllib.loads(text.replace("/etc/wanprobe/key/hmac.key", str(key)))
    cfg = parse_config(data)
    assert cfg.metrics_listen == ("0.0.0.0", 9862) and cfg.hmac_key == b"k" * 32
    assert cfg.auto_apply.enabled and cfg.auto_apply.tuners == ("sysctl",)
    mesh = parse_mesh(tomllib.loads(cm["data"]["mesh.toml"]))
    assert len(mesh.hosts) == 6


def test_footprint_is_the_documented_measurement_and_sizes_requests():
    doc = (REPO / "docs" / "fleet.md").read_text()
    section = doc[doc.index("## 6. Agent cost"):]
    rows = re.findall(r"^\| ([\d,]+) \| (\d+) MiB \| ([\d.–]+) % \|", section, re.M)
    documented = [(int(n.replace(",", "")), float(rss), float(cpu.split("–")[-1]))
                  for n, rss, cpu in rows]
    assert documented == [tuple(x) for x in kube_pods.FOOTPRINT]
    small = kube_pods.agent_resources(6)       # the example mesh: 3 peers at most
    assert (small.cpu_request_milli, small.memory_request_mib) == (13, 54)
    big = kube_pods.agent_resources(1000)
    assert (big.cpu_request_milli, big.memory_request_mib, big.memory_limit_mib) == (55, 79, 256)
    huge = kube_pods.agent_resources(3000)     # extrapolated along the measured slope
    assert huge.memory_request_mib == 142 and huge.memory_limit_mib == 284


def test_bad_input_is_one_line(tmp_path):
    aliases = tmp_path / "bomb.yml"
    aliases.write_text("a: &a [x, x]\nb: &b [*a, *a]\ngroups: [*b, *b]\n")
    notrules = tmp_path / "not.yml"
    notrules.write_text("groups: [{name: g}]\n")
    badtuner = tmp_path / "plan.json"
    badtuner.write_text('{"changes": [{"tuner": "firmware", "key": "x"}]}')
    twoports = tmp_path / "mesh.toml"
    twoports.write_text('[sites.a]\nmetrics_port = 9100\nhosts = [{ name = "a1", address = '
                        '"10.0.0.1" }]\n[sites.b]\nhosts = [{ name = "b1", address = "10.0.0.2" }]\n')
    for args, text in [
            (("--rules", str(aliases)), "aliases"), (("--rules", str(notrules)), "not Prometheus"),
            (("--namespace", "Wanprobe"), "RFC 1123"), (("--site-label", "bad label"), "label"),
            (("--plan", str(aliases)), "--tuner and --plan"),
            (("--tuner", "--plan", str(notrules)), "not a wanprobe plan"),
            (("--tuner", "--plan", str(badtuner)), "cannot be applied unattended"),
            (("--image", "x y"), "image"), (("--scrape-interval", "0s"), "scrape-interval")]:
        assert text in one_line_error(invoke("fleet", "kubernetes", "--mesh", MESH, *args))
    assert "metrics ports" in one_line_error(invoke("fleet", "kubernetes", "--mesh", twoports))


def test_containerfile_builds_what_the_manifests_run():
    text = (REPO / "Containerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\S+) \./", text, re.M))
    assert {p.rstrip("*") for p in packages} <= copied  # every package of the wheel
    assert re.search(rf"^COPY pyproject.toml {pyproject['project']['readme']} \./$", text, re.M)
    assert "pip wheel" in text and "--no-index --find-links /wheels wanprobe" in text
    (script,) = pyproject["project"]["scripts"]
    assert f'ENTRYPOINT ["{script}"]' in text
    # the default command is the one the agent DaemonSet passes
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    assert cmd == ["daemon", "--config", f"{kube_pods.CONFIG_DIR}/wanprobe.toml"]
    assert re.search(r"^FROM \S+ AS wheels$", text, re.M)
    assert f"python:{pyproject['project']['requires-python'].lstrip('>=')}" in text
