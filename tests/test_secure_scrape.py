"""Issue 37, the scrape side of a secured listener: `fleet targets --format scrape-config` writes
the job Prometheus scrapes it with (`scheme: https`, `tls_config`, `basic_auth`; checked by
Debian's `promtool check config`), `fleet kubernetes` mounts the web config and certificate from
Secrets and renders a ServiceMonitor with them (kubernetes-validate for the built-in kinds; the
ServiceMonitor against the prometheus-operator CRD's own schema, vendored), and `daemon --check`
warns about a listener off loopback without a web config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import tomllib

import pytest
import yaml
from clirun import invoke, one_line_error
from conftest import REPO, require, require_tool
from tls_certs import bcrypt_hash, make_certs, web_config

from wanprobe.daemon.config import parse_config
from wanprobe.httpd.web_config import load_web_config

MESH = REPO / "systemd" / "mesh.toml.example"
CRD_SCHEMA = REPO / "tests" / "fixtures" / "fleet" / "servicemonitor-v1.schema.json"
SECURED = ("--web-config-secret", "wanprobe-web", "--tls-secret", "wanprobe-tls",
           "--scrape-client-cert-secret", "prometheus-client", "--basic-auth-secret",
           "wanprobe-scrape")


def promtool_config(path) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), "check", "config", str(path)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def prom_files(tmp_path):
    """What the Prometheus host holds: the CA, its client certificate and key, the password
    (promtool stats the client certificate and key)."""
    files = {name: tmp_path / name for name in ("ca.crt", "client.crt", "client.key", "password")}
    for path in files.values():
        path.write_text("x\n")
    return files


def test_scrape_config_over_tls_with_basic_auth_passes_promtool(tmp_path, prom_files):
    f = prom_files
    r = invoke("fleet", "targets", "--mesh", MESH, "--site", "taipei", "--format",
               "scrape-config", "--scheme", "https", "--ca-file", f["ca.crt"],
               "--client-cert", f["client.crt"], "--client-key", f["client.key"],
               "--server-name", "wanprobe.example.net", "--basic-auth-user", "prometheus",
               "--password-file", f["password"])
    assert r.returncode == 0, r.stderr
    (job,) = yaml.safe_load(r.stdout)["scrape_configs"]
    sd = json.loads(invoke("fleet", "targets", "--mesh", MESH, "--site", "taipei").stdout)
    assert job == {"job_name": "wanprobe", "scheme": "https",
                   "tls_config": {"ca_file": str(f["ca.crt"]), "cert_file": str(f["client.crt"]),
                                  "key_file": str(f["client.key"]),
                                  "server_name": "wanprobe.example.net"},
                   "basic_auth": {"username": "prometheus", "password_file": str(f["password"])},
                   "static_configs": sd}
    config = tmp_path / "prometheus.yml"
    config.write_text(r.stdout)
    out = promtool_config(config)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    # promtool is not vacuous: the same job without the client key's file is refused
    f["client.key"].unlink()
    out = promtool_config(config)
    assert out.returncode != 0 and "client.key" in out.stdout + out.stderr


def test_scrape_config_reads_the_file_sd_file_fleet_targets_writes(tmp_path, prom_files):
    targets = tmp_path / "wanprobe.json"
    targets.write_text(invoke("fleet", "targets", "--mesh", MESH).stdout)
    r = invoke("fleet", "targets", "--mesh", MESH, "--format", "scrape-config", "--job", "wp",
               "--targets-file", targets, "--scheme", "https", "--ca-file", prom_files["ca.crt"])
    assert r.returncode == 0, r.stderr
    (job,) = yaml.safe_load(r.stdout)["scrape_configs"]
    assert job["job_name"] == "wp" and job["file_sd_configs"] == [{"files": [str(targets)]}]
    assert "static_configs" not in job and "basic_auth" not in job
    config = tmp_path / "prometheus.yml"
    config.write_text(r.stdout)
    out = promtool_config(config)  # it reads the file_sd file too, and has nothing to say
    assert out.returncode == 0 and "WARNING" not in out.stdout + out.stderr, out.stdout
    # plain http, as before: a job Prometheus accepts, nothing secured
    plain = invoke("fleet", "targets", "--mesh", MESH, "--format", "scrape-config")
    (job,) = yaml.safe_load(plain.stdout)["scrape_configs"]
    assert set(job) == {"job_name", "scheme", "static_configs"} and job["scheme"] == "http"
    config.write_text(plain.stdout)
    assert promtool_config(config).returncode == 0


@pytest.mark.parametrize("args, said", [
    (("--ca-file", "/etc/prometheus/ca.crt"), "add --format scrape-config"),
    (("--job", "wp"), "add --format scrape-config"),
    (("--format", "yaml"), "--format: 'yaml' is not one of file-sd, scrape-config"),
    (("--format", "scrape-config", "--scheme", "ftp"), "--scheme: 'ftp' is not http or https"),
    (("--format", "scrape-config", "--ca-file", "/ca.crt"), "--ca-file is a TLS setting: add "
     "--scheme https"),
    (("--format", "scrape-config", "--basic-auth-user", "p", "--password-file", "/pw"),
     "crosses the network in clear"),
    (("--format", "scrape-config", "--scheme", "https", "--client-cert", "/c.crt"),
     "--client-cert and --client-key go together"),
    (("--format", "scrape-config", "--scheme", "https", "--basic-auth-user", "p"),
     "--basic-auth-user and --password-file go together"),
    (("--format", "scrape-config", "--scheme", "https", "--basic-auth-user", "a:b",
      "--password-file", "/pw"), "is not a user name"),
    (("--format", "scrape-config", "--scheme", "https", "--ca-file", "ca.crt"),
     "--ca-file: 'ca.crt' must be an absolute path"),
    (("--format", "scrape-config", "--targets-file", "wanprobe.json"),
     "--targets-file: 'wanprobe.json' must be an absolute path"),
    (("--format", "scrape-config", "--scheme", "https", "--server-name", "bad name"),
     "--server-name: 'bad name' is not a host name"),
    (("--format", "scrape-config", "--job", "bad job"), "--job: 'bad job' is not a Prometheus "
     "job name")])
def test_bad_scrape_options_are_one_line(args, said):
    r = invoke("fleet", "targets", "--mesh", MESH, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert said in one_line_error(r)


def render(*args: str) -> list[dict]:
    r = invoke("fleet", "kubernetes", "--mesh", MESH, *args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d is not None]


def agents(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "DaemonSet"
            and d["metadata"]["namespace"] == "wanprobe"]


def test_secured_manifests_pass_kubernetes_validate(tmp_path):
    try:
        import kubernetes_validate as k
    except ImportError:
        require("needs kubernetes-validate (pip install -e .[test])")
    docs = render(*SECURED)
    version = k.utils.latest_version()
    builtin = [d for d in docs if "monitoring.coreos.com" not in d["apiVersion"]]
    for doc in builtin:
        k.validate(doc, version, strict=True)
    bad = json.loads(json.dumps(agents(docs)[0]))  # a misspelt projection is refused
    bad["spec"]["template"]["spec"]["volumes"][-1]["projected"]["sources"][0]["secrets"] = {}
    with pytest.raises(k.ValidationError):
        k.validate(bad, version, strict=True)
    stream = tmp_path / "all.yaml"
    stream.write_text(invoke("fleet", "kubernetes", "--mesh", MESH, *SECURED).stdout)
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(stream)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (out.stdout + out.stderr).count("passed for resource") == len(builtin) == 6


def test_daemonset_mounts_the_web_config_and_certificate_and_probes_use_https(tmp_path):
    docs = render(*SECURED)
    for ds in agents(docs):
        pod = ds["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert {"name": "web", "mountPath": "/etc/wanprobe/web", "readOnly": True} \
            in c["volumeMounts"]
        (web,) = [v for v in pod["volumes"] if v["name"] == "web"]
        assert web == {"name": "web", "projected": {"defaultMode": 0o400, "sources": [
            {"secret": {"name": "wanprobe-web"}},
            {"secret": {"name": "wanprobe-tls", "items": [{"key": "tls.crt", "path": "tls.crt"},
                                                           {"key": "tls.key",
                                                            "path": "tls.key"}]}}]}}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics",
                                           "scheme": "HTTPS"}
    # the agent's config names the mounted web config and leaves /healthz to the kubelet
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["namespace"] == "wanprobe")
    daemon = tomllib.loads(cm["data"]["wanprobe.toml"])["daemon"]
    assert daemon["web_config_file"] == "/etc/wanprobe/web/web-config.yml"
    assert daemon["web_healthz_open"] is True
    cfg = parse_config(tomllib.loads(cm["data"]["wanprobe.toml"]))
    assert cfg.web_healthz_open and str(cfg.web_config_file).startswith("/etc/wanprobe/web/")
    # the web config docs/fleet.md §7 shows loads from that directory as projected there
    web_dir = tmp_path / "web"
    certs = make_certs(tmp_path / "certs", server_sans="DNS:wanprobe-agent.wanprobe.svc")
    web_dir.mkdir()
    shutil.copy(certs.server_cert, web_dir / "tls.crt")
    shutil.copy(certs.server_key, web_dir / "tls.key")
    (web_dir / "web-config.yml").write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
        f"basic_auth_users:\n  prometheus: '{bcrypt_hash()}'\n")
    loaded = load_web_config(web_dir / "web-config.yml")
    assert loaded.ssl_context is not None and loaded.users


def _strict(schema):
    """The CRD's schema as the API server prunes it: a field it does not declare is dropped in
    silence (structural schemas), so here it is an error."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def test_servicemonitor_fits_the_prometheus_operator_crd():
    """kubernetes-validate has core schemas only (SchemaNotFoundError for a CRD kind), so the
    ServiceMonitor is checked against the operator's own openAPIV3Schema (vendored, without
    descriptions). Not checked: the CRD's CEL rules, and whether the Secrets exist."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = _strict(json.loads(CRD_SCHEMA.read_text()))
    monitors = {name: next(d for d in render(*args) if d["kind"] == "ServiceMonitor")
                for name, args in (("plain", ()), ("secured", SECURED))}
    for monitor in monitors.values():
        jsonschema.validate(monitor, schema)
    (endpoint,) = monitors["secured"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "wanprobe-tls", "key": "ca.crt"}},
        "serverName": "wanprobe-agent.wanprobe.svc",
        "cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
        "keySecret": {"name": "prometheus-client", "key": "tls.key"}}
    assert endpoint["basicAuth"] == {"username": {"name": "wanprobe-scrape", "key": "username"},
                                     "password": {"name": "wanprobe-scrape", "key": "password"}}
    (plain,) = monitors["plain"]["spec"]["endpoints"]
    assert set(plain) == {"port", "path", "interval", "relabelings"}
    # the schema is not vacuous: misspelt fields, a missing key, an unknown scheme are refused
    for path, value in ((("tlsConfig", "servername"), "x"), (("basicAuth", "password"),
                                                             {"name": "s"}),
                        (("scheme",), "Https"), (("tlsConfig", "ca", "secret", "nam"), "x"),
                        (("tlsconfig",), {})):
        bad = json.loads(json.dumps(monitors["secured"]))
        node = bad["spec"]["endpoints"][0]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_ca_secret_and_server_name_override_the_defaults():
    docs = render(*SECURED[:4], "--ca-secret", "fleet-ca", "--server-name", "wanprobe.example.net")
    (endpoint,) = next(d for d in docs if d["kind"] == "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "fleet-ca", "key": "ca.crt"}},
                                     "serverName": "wanprobe.example.net"}
    assert "basicAuth" not in endpoint


def test_unsecured_manifests_carry_nothing_of_it():
    docs = render("--key-secret", "wanprobe-hmac")
    text = json.dumps(docs)
    for word in ("web_config_file", "web_healthz_open", "HTTPS", "tlsConfig", "basicAuth",
                 "projected", '"scheme"'):
        assert word not in text


@pytest.mark.parametrize("args, said", [
    (("--web-config-secret", "wanprobe-web"), "--web-config-secret and --tls-secret go together"),
    (("--tls-secret", "wanprobe-tls"), "--web-config-secret and --tls-secret go together"),
    (("--basic-auth-secret", "s"), "--basic-auth-secret is a setting of the secured listener"),
    (("--server-name", "x.example"), "--server-name is a setting of the secured listener"),
    (("--ca-secret", "ca"), "--ca-secret is a setting of the secured listener"),
    ((*SECURED[:4], "--basic-auth-secret", "Bad_Name"), "--basic-auth-secret: 'Bad_Name' is not "
     "a Kubernetes Secret name"),
    ((*SECURED[:4], "--server-name", "bad name"), "--server-name: 'bad name' is not a DNS name")])
def test_bad_kubernetes_security_options_are_one_line(args, said):
    r = invoke("fleet", "kubernetes", "--mesh", MESH, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert said in one_line_error(r)


OPEN = "is not loopback and no daemon.web_config_file secures it: the fleet's topology and " \
       "tuning history are open to anyone who can reach it"


def check(tmp_path, listen: str, *, mesh: bool = False, web: bool = False) -> list[str]:
    """`daemon --check`'s warning lines (it exits 0 with them)."""
    lines = [f'[daemon]\nstate_dir = "{tmp_path}"\nmetrics_listen = "{listen}"\n']
    if mesh:
        lines.append(f'mesh_file = "{MESH}"\nhostname = "tpe-gpu-01"\n')
    else:
        lines.append('[[peers]]\nname = "p"\naddress = "198.18.0.2"\n')
    if web:
        certs = make_certs(tmp_path / "certs")
        path = web_config(tmp_path / "web-config.yml", certs,
                          users={"prometheus": bcrypt_hash()})
        lines.insert(1, f'web_config_file = "{path}"\n')
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text("".join(lines))
    r = invoke("daemon", "--config", cfg, "--check")
    assert r.returncode == 0 and "ok, host" in r.stdout, r.stderr
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


@pytest.mark.parametrize("listen, opened", [
    ("0.0.0.0:9862", True), ("[::]:9862", True), ("198.18.0.1:9862", True),
    ("127.0.0.1:9862", False), ("[::1]:9862", False)])
def test_check_warns_about_a_listener_off_loopback_without_a_web_config(tmp_path, listen, opened):
    said = check(tmp_path, listen)
    if not opened:
        assert said == []
        return
    (line,) = said
    assert line.startswith("wanprobe: warning: ") and f"daemon.metrics_listen {listen} " in line
    assert OPEN in line


def test_a_web_config_quiets_it_and_the_mesh_warning_still_fires(tmp_path):
    """The mesh (systemd/mesh.toml.example) has Prometheus scrape tpe-gpu-01 at 10.1.0.11:9862."""
    assert check(tmp_path, "0.0.0.0:9862", mesh=True, web=True) == []
    (line,) = check(tmp_path, "0.0.0.0:9862", mesh=True)
    assert OPEN in line
    for web in (False, True):   # loopback: nothing open, and every scrape would fail
        (line,) = check(tmp_path, "127.0.0.1:9862", mesh=True, web=web)
        assert "answers on loopback only, but Prometheus scrapes this host at 10.1.0.11:9862" \
            in line
    said = check(tmp_path, "10.9.9.9:9862", mesh=True)   # both at once, one line each
    assert len(said) == 2 and "is bound to another address" in said[0] and OPEN in said[1]


def test_the_documented_scrape_job_is_what_fleet_targets_writes():
    doc = (REPO / "docs" / "fleet.md").read_text()
    block = doc[doc.index("  ```yaml\n  scrape_configs:") + len("  ```yaml\n"):]
    shown_job = yaml.safe_load(textwrap.dedent(block[:block.index("  ```")]))
    r = invoke("fleet", "targets", "--mesh", MESH, "--site", "taipei", "--format",
               "scrape-config", "--targets-file", "/etc/prometheus/wanprobe.json", "--scheme",
               "https", "--ca-file", "/etc/prometheus/wanprobe-ca.crt", "--basic-auth-user",
               "prometheus", "--password-file", "/etc/prometheus/wanprobe.password")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout) == shown_job
