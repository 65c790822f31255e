"""The Kubernetes manifests: deploy/ and each overlay render with kubectl's
kustomize, every rendered document validates against the Kubernetes schemas
(kubernetes-validate, strict), and the settings that must agree do: the
drain fits the grace period, the probes speak gRPC health on the health
port, the socket directory is shared, the memory limit holds the budget, the
ConfigMap and the DaemonSet's environment make a configuration the real
server accepts, each overlay sets what it is for, and the s3 overlay's keys
come from a Secret and appear in no ConfigMap, and every setup carries the
Grafana dashboard's ConfigMap for Grafana's sidecar. The Prometheus alert
rules pass promtool's check and their unit tests, and name only metrics the
real server exports."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import urllib.request

import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tce import api
from tce.core import _knobs
from tce.tools._server import LocalServer, server_binary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
# The oldest Kubernetes the manifests target (gRPC probes are GA since 1.27),
# and the newest the validator knows.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
TARGETS = [".", "base", "overlays/single-node", "overlays/cluster-mysql", "overlays/rdma",
           "overlays/hugepages", "overlays/s3"]
# Kustomizations that only the base includes (not a setup of their own).
INCLUDED = ["grafana"]
CLUSTER = ["overlays/cluster-mysql", "overlays/rdma", "overlays/hugepages", "overlays/s3"]
CONFIG_PATH = "/etc/tce/tce.toml"  # where the DaemonSet mounts the ConfigMap
# What the kubelet would put in the server's environment (stand-ins).
NODE_IP = "10.0.0.7"
SECRETS = {("tce-mysql", "url"): "mysql://tce:s3cret@mysql.example.com:3306/tce",
           ("tce-s3-credentials", "AWS_ACCESS_KEY_ID"): "AKIASTANDINKEYID0001",
           ("tce-s3-credentials", "AWS_SECRET_ACCESS_KEY"): "StandInSecretAccessKey/0123456789abcdefghij",
           ("tce-s3-credentials", "AWS_SESSION_TOKEN"): "StandInSessionToken+0123456789abcdefghij"}
S3_SECRET = "tce-s3-credentials"
S3_SECRET_EXAMPLE = os.path.join(DEPLOY, "overlays", "s3", "secret.example.yaml")
# The only kustomization fields used: Debian 12's kubectl 1.20 (kustomize
# v2.0.3) must render the same files as a current kubectl.
KUSTOMIZE_V2_FIELDS = {"apiVersion", "kind", "namespace", "resources", "bases", "configMapGenerator",
                       "patchesStrategicMerge", "images", "generatorOptions"}

ALERTS = os.path.join(DEPLOY, "prometheus", "tce-alerts.yaml")
ALERT_TESTS = os.path.join(DEPLOY, "prometheus", "tce-alerts.test.yaml")
OPERATIONS_DOC = os.path.join(REPO, "docs", "operations.md")
DASHBOARD = os.path.join(DEPLOY, "grafana", "tce-dashboard.json")

pytestmark = pytest.mark.deploy

_rendered: dict[str, str] = {}


def _render(target: str) -> list[dict]:
    """The documents `kubectl kustomize deploy/<target>` renders (fresh copies)."""
    if target not in _rendered:
        kubectl = shutil.which("kubectl")
        assert kubectl, "kubectl is missing: `make setup` installs it (Debian's kubernetes-client)"
        p = subprocess.run([kubectl, "kustomize", os.path.join(DEPLOY, target)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        _rendered[target] = p.stdout
    return [d for d in yaml.safe_load_all(_rendered[target]) if d]


def _one(docs: list[dict], kind: str, name: str) -> dict:
    """The one document of this kind whose name is name (or name-<hash>)."""
    found = [d for d in docs if d["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?",
                                                                     d["metadata"]["name"])]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def _server(docs):
    ds = _one(docs, "DaemonSet", "tce-server")
    return ds, ds["spec"]["template"]["spec"]["containers"][0]


def _job(docs):
    job = _one(docs, "Job", "example-train")
    return job, job["spec"]["template"]["spec"]["containers"][0]


def _by_name(items) -> dict[str, dict]:
    return {i["name"]: i for i in items or []}


def _mounts(container) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def _config_text(docs) -> str:
    return _one(docs, "ConfigMap", "tce-server-config")["data"]["tce.toml"]


def _config(docs) -> dict[str, str]:
    """The flat TOML of the ConfigMap as key -> value (quotes removed)."""
    out = {}
    for line in _config_text(docs).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip('"')
    return out


def _settings(docs) -> dict[str, str]:
    """The server's settings as the ConfigMap and the DaemonSet's TCE_*
    environment give them (the environment wins), without running it."""
    _, c = _server(docs)
    env = _kubelet_env(c)
    config = _config(docs)
    config.update({k[len("TCE_"):].lower(): v for k, v in env.items() if k.startswith("TCE_")})
    return config


def _roots(value: str) -> list[tuple[str, str | None]]:
    """storage_roots as (directory, s3://bucket[/prefix] or None) pairs."""
    out = []
    for entry in filter(None, (e.strip() for e in value.split(","))):
        directory, _, url = entry.partition("=")
        assert directory.startswith("/"), f"not an absolute directory: {entry}"
        assert not url or re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^,]*)?", url), entry
        out.append((directory, url or None))
    return out


@functools.lru_cache(maxsize=None)
def _server_has_s3() -> bool:
    """Whether this tce-server knows the S3 settings (its --help lists them)."""
    p = subprocess.run([server_binary(), "--help"], capture_output=True, text=True, timeout=60)
    return "TCE_S3_ENDPOINT" in p.stdout + p.stderr


def _skip_without_s3(target: str) -> None:
    if target == "overlays/s3" and not _server_has_s3():
        pytest.skip("this tce-server has no S3 settings (s3_endpoint...): the s3 overlay's "
                    "configuration is checked against a server that has them")


def _bytes(q: str) -> int:
    """A Kubernetes memory quantity, or a server size (8GiB, 512MiB), in bytes."""
    m = re.fullmatch(r"(\d+)\s*(Ki|Mi|Gi|Ti|KiB|MiB|GiB|TiB)?", q)
    assert m, f"not a binary size: {q}"
    return int(m.group(1)) << {None: 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2) and m.group(2)[0]]


def _kubelet_env(container) -> dict[str, str]:
    """The container's environment as the kubelet would set it: secret and
    downward-API values from stand-ins, $(VAR) expanded from earlier ones."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = SECRETS[(ref["name"], ref["key"])]
        else:
            assert e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.hostIP", f"unexpected {e}"
            env[e["name"]] = NODE_IP
    return env


def _redacted(url: str) -> str:
    """A mysql:// URL with its password as the server prints it."""
    return re.sub(r"^(mysql://[^:/@]+):[^@]*@", r"\1:***@", url)


def _print_config(docs, tmp_path, output: list[str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Runs the real server with the DaemonSet's args and environment and the
    ConfigMap as its config file, with --print-config. Returns (the effective
    configuration, the TCE_* environment given); appends what it printed
    (stdout and stderr) to output."""
    _, c = _server(docs)
    config = tmp_path / "tce.toml"
    config.write_text(_config_text(docs))
    args = [str(config) if a == CONFIG_PATH else a for a in c.get("args", [])]
    assert str(config) in args, f"the server is not pointed at the ConfigMap: {c.get('args')}"
    kubelet = _kubelet_env(c)
    given = {k: v for k, v in kubelet.items() if k.startswith("TCE_")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TCE_", "AWS_"))}
    p = subprocess.run([server_binary(), *args, "--print-config"], capture_output=True, text=True,
                       timeout=60, env={**env, **kubelet})
    if output is not None:
        output.append(p.stdout + p.stderr)
    assert p.returncode == 0, p.stderr
    effective = {}
    for line in p.stdout.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(" = ")
            effective[key] = value.strip('"')
    return effective, given


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_manifest_validates(target):
    docs = _render(target)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["Namespace", "ServiceAccount", "ConfigMap", "ConfigMap", "ConfigMap", "DaemonSet", "Service", "Job"])
    for d in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(d, version, strict=True)  # raises on any error
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "tce-system", d["metadata"]
        # The schemas do not see it, the API server does: every mount names
        # a volume of its pod (an overlay that drops one drops both).
        if d["kind"] in ("DaemonSet", "Job"):
            pod = d["spec"]["template"]["spec"]
            volumes = _by_name(pod.get("volumes"))
            for c in pod["containers"]:
                assert {m["name"] for m in c.get("volumeMounts", [])} <= set(volumes), (d["kind"], c["name"])


def test_the_validator_rejects_a_misspelled_field():
    """Proves the validation above can fail: strict mode knows the schema."""
    ds, container = _server(_render("base"))
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSIONS[0], strict=True)


def test_kustomizations_use_only_what_kustomize_v2_renders():
    """The CI machine's kubectl is Debian's 1.20, whose kustomize (v2.0.3)
    reads directories only under `bases` and knows no `patches`."""
    found = []
    for root, _, files in os.walk(DEPLOY):
        if "kustomization.yaml" not in files:
            continue
        found.append(root)
        k = yaml.safe_load(open(os.path.join(root, "kustomization.yaml")))
        assert set(k) <= KUSTOMIZE_V2_FIELDS, (root, set(k) - KUSTOMIZE_V2_FIELDS)
        for r in k.get("resources", []):
            assert os.path.isfile(os.path.join(root, r)), f"{root}: resource {r} must be a file"
        for b in k.get("bases", []):
            assert os.path.isdir(os.path.join(root, b)), f"{root}: base {b} must be a directory"
    assert len(found) == len(TARGETS) + len(INCLUDED), found


@pytest.mark.parametrize("target", TARGETS)
def test_every_setup_carries_the_grafana_dashboard_for_the_sidecar(target):
    """Grafana's sidecar loads the dashboards of ConfigMaps labelled
    grafana_dashboard: "1"; the label is on that ConfigMap only."""
    docs = _render(target)
    cm = _one(docs, "ConfigMap", "tce-dashboard")
    assert cm["metadata"].get("labels") == {"grafana_dashboard": "1"}, cm["metadata"]
    assert json.loads(cm["data"]["tce-dashboard.json"]) == json.load(open(DASHBOARD))
    labelled = [d["metadata"]["name"] for d in docs if "grafana_dashboard" in d["metadata"].get("labels", {})]
    assert labelled == [cm["metadata"]["name"]], labelled


@pytest.mark.parametrize("target", TARGETS)
def test_the_server_accepts_the_config_map_and_the_environment(target, tmp_path):
    _skip_without_s3(target)
    docs = _render(target)
    effective, given = _print_config(docs, tmp_path)
    assert effective["socket"] == "/run/tce/tce.sock"
    assert effective["health_listen"] == "0.0.0.0:7071"
    assert effective["metrics_listen"] == "0.0.0.0:9464"
    assert effective["log_format"] == "json"
    assert [d for d, _ in _roots(effective["storage_roots"])] == ["/mnt/checkpoints"]
    for key, value in _config(docs).items():
        if "TCE_" + key.upper() in given:
            continue  # the environment wins (checked below)
        assert effective[key] == value, f"config file {key} = {value}, server: {effective[key]}"
    for name, value in given.items():
        assert effective[name[len("TCE_"):].lower()] == _redacted(value), f"{name}={value} not applied (passwords printed as ***)"


@pytest.mark.parametrize("target", TARGETS)
def test_shutdown_probes_and_metrics_agree_with_the_server_config(target):
    docs = _render(target)
    ds, c = _server(docs)
    pod = ds["spec"]["template"]["spec"]
    config = _config(docs)
    # The drain finishes before the kubelet's SIGKILL, with time to exit.
    assert pod["terminationGracePeriodSeconds"] * 1000 >= int(config["drain_timeout_ms"]) + 5000
    # The standard gRPC health service on the health port: readiness on ""
    # (drops when a drain begins), liveness and startup on "liveness" (never
    # kills a drain).
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert config["health_listen"] == "0.0.0.0:%d" % ports["health"]
    assert c["readinessProbe"]["grpc"] == {"port": ports["health"], "service": ""}
    assert c["livenessProbe"]["grpc"] == {"port": ports["health"], "service": "liveness"}
    assert c["startupProbe"]["grpc"] == {"port": ports["health"], "service": "liveness"}
    # Prometheus finds the metrics port by the pod's annotations.
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/path"] == "/metrics"
    assert config["metrics_listen"] == "0.0.0.0:%s" % ann["prometheus.io/port"]
    assert int(ann["prometheus.io/port"]) == ports["metrics"]
    # The ring's peers reach the node's own address.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert ports["peer"] == 7070
    assert c["image"] == "localhost/tce-server:latest"


@pytest.mark.parametrize("target", TARGETS)
def test_the_memory_limit_holds_the_cache_budget(target):
    docs = _render(target)
    _, c = _server(docs)
    res = c["resources"]
    limit = _bytes(res["limits"]["memory"])
    # Requests equal limits: the node reserves the cache.
    assert res["requests"]["memory"] == res["limits"]["memory"]
    env = _kubelet_env(c)
    budget = env.get("TCE_MEMORY_BUDGET", _config(docs)["memory_budget"])
    assert not budget.endswith("%"), "a percentage is of the node's memory, not of the pod's limit"
    # Huge pages are their own resource (requests equal limits, as Kubernetes
    # wants): with memory_backing = hugetlb they hold the budget.
    huge = res["limits"].get("hugepages-2Mi")
    assert huge == res["requests"].get("hugepages-2Mi")
    assert (env.get("TCE_MEMORY_BACKING") == "hugetlb") == (huge is not None)
    held = limit + (_bytes(huge) if huge else 0)
    # "auto" is 90% of the cgroup limit; an explicit budget must leave the
    # server the same 10% (gRPC, metadata, page tables) or more.
    budget_bytes = limit * 9 // 10 if budget == "auto" else _bytes(budget)
    assert budget_bytes * 10 <= held * 9, (budget, res["limits"])
    if huge:
        assert budget_bytes <= _bytes(huge), "the budget must fit in the huge pages asked for"
    assert budget_bytes >= 8 << 30, "a cache smaller than one large shard is no cache"
    # The budget is pinned memory of this pod: the container may lock it.
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


@pytest.mark.parametrize("target", TARGETS)
def test_training_pods_share_the_socket_directory_and_the_storage(target):
    docs = _render(target)
    ds, server = _server(docs)
    job, train = _job(docs)
    pod, jpod = ds["spec"]["template"]["spec"], job["spec"]["template"]["spec"]
    config = _config(docs)
    # One hostPath for the socket directory, mounted where the server puts
    # its socket and where the client looks for it.
    sockets_dir = os.path.dirname(config["socket"])
    server_vols, job_vols = _by_name(pod["volumes"]), _by_name(jpod["volumes"])
    assert _mounts(server)["sockets"] == sockets_dir
    assert _mounts(train)["tce-sockets"] == sockets_dir
    assert server_vols["sockets"]["hostPath"]["path"] == job_vols["tce-sockets"]["hostPath"]["path"]
    assert _by_name(train["env"])["TCE_SOCKET"]["value"] == config["socket"]
    # The storage: a filesystem root is the same node path at the same
    # place, so a file the client names is the file the server persists. An
    # S3 root is no node path: the server mounts nothing there, and the
    # training pods keep only what DeepSpeed writes itself (an emptyDir).
    [(root, bucket)] = _roots(_settings(docs)["storage_roots"])
    assert _mounts(train)["checkpoints"] == root
    if bucket is None:
        assert _mounts(server)["checkpoints"] == root
        assert server_vols["checkpoints"]["hostPath"]["path"] == job_vols["checkpoints"]["hostPath"]["path"]
    else:
        assert root not in _mounts(server).values() and "checkpoints" not in server_vols
        assert job_vols["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    assert train["args"][0].count("--save_dir " + root + "/") == 1
    # Training pods land only on nodes that run a server.
    assert jpod["nodeSelector"].items() >= pod["nodeSelector"].items(), (jpod["nodeSelector"], pod["nodeSelector"])
    assert all(t in pod.get("tolerations", []) for t in jpod.get("tolerations", []))
    # The DeepSpeed config the job mounts selects the TCE engine.
    ds_cm = _one(docs, "ConfigMap", "deepspeed-config")
    assert job_vols["deepspeed-config"]["configMap"]["name"] == ds_cm["metadata"]["name"]
    ds_config = json.loads(ds_cm["data"]["ds_config.json"])
    assert ds_config["checkpoint_engine"] == "tce"
    assert ds_config["tce"]["job"] == _by_name(train["env"])["TCE_JOB"]["value"]
    assert "--deepspeed_config %s/ds_config.json" % _mounts(train)["deepspeed-config"] in train["args"][0]
    # Indexed: JOB_COMPLETION_INDEX is the node rank.
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"]


def test_single_node_has_no_ring_and_keeps_sqlite():
    for target in (".", "overlays/single-node"):
        docs = _render(target)
        _, c = _server(docs)
        env = _by_name(c.get("env"))
        config = _config(docs)
        assert "TCE_PEER_LISTEN" not in env and "peer_listen" not in config
        assert "TCE_METADATA_URL" not in env and "metadata_url" not in config  # sqlite in state_dir
        assert _mounts(c)["state"] == config["state_dir"]
        job, train = _job(docs)
        assert job["spec"]["completions"] == 1 and "--nnodes=1 " in train["args"][0]


@pytest.mark.parametrize("target", CLUSTER)
def test_cluster_overlays_take_secrets_and_join_the_ring(target, tmp_path):
    docs = _render(target)
    ds, c = _server(docs)
    env = _by_name(c["env"])
    assert env["TCE_METADATA_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tce-mysql", "key": "url"}
    assert env["TCE_PEER_LISTEN"]["value"] == "0.0.0.0:7070"
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    names = [e["name"] for e in c["env"]]
    assert names.index("NODE_IP") < names.index("TCE_PEER_ADVERTISE"), "$(NODE_IP) would not expand"
    # The token arrives as a file from a Secret, never as a value.
    assert "TCE_PEER_TOKEN" not in env
    vols = _by_name(ds["spec"]["template"]["spec"]["volumes"])
    assert vols["peer-token"]["secret"]["secretName"] == "tce-peer-token"
    assert env["TCE_PEER_TOKEN_FILE"]["value"] == _mounts(c)["peer-token"] + "/token"
    assert not any(d["kind"] == "Secret" for d in docs), "secrets are the admin's, never in the repo"
    # Every node of the job runs its rank.
    job, train = _job(docs)
    assert job["spec"]["completions"] == 2 and "--nnodes=2 " in train["args"][0]
    # What the server makes of it: MySQL, and this node's address for peers.
    _skip_without_s3(target)
    effective, _ = _print_config(docs, tmp_path)
    url = SECRETS[("tce-mysql", "url")]
    assert effective["metadata_url"] == _redacted(url) != url  # the password is never printed
    assert effective["peer_advertise"] == NODE_IP + ":7070"
    assert effective["peer_token_file"] == "/etc/tce-peer/token"


def test_the_rdma_overlay_uses_ofi_verbs_and_asks_for_the_device(tmp_path):
    docs = _render("overlays/rdma")
    ds, c = _server(docs)
    effective, _ = _print_config(docs, tmp_path)
    assert effective["ring_transport"] == "ofi" and effective["ofi_provider"] == "verbs"
    assert c["resources"]["requests"]["rdma/hca_shared_devices_a"] == "1"
    assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
    # Registration pins memory: IPC_LOCK lifts RLIMIT_MEMLOCK, and only for
    # root (Kubernetes gives a non-root container no effective capabilities).
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    assert c["securityContext"]["runAsUser"] == 0
    # Both the servers and the training pods are on the RDMA nodes.
    job, _ = _job(docs)
    assert ds["spec"]["template"]["spec"]["nodeSelector"]["tce.dev/rdma"] == "true"
    assert job["spec"]["template"]["spec"]["nodeSelector"]["tce.dev/rdma"] == "true"
    # The other overlays stay on TCP and ask for no RDMA device.
    for target in ("overlays/cluster-mysql", "overlays/single-node"):
        _, other = _server(_render(target))
        assert "TCE_RING_TRANSPORT" not in _by_name(other.get("env"))
        assert not any(r.startswith("rdma/") for r in other["resources"]["limits"])


def test_the_hugepages_overlay_puts_the_cache_on_the_huge_pages_it_asks_for(tmp_path):
    docs = _render("overlays/hugepages")
    _, c = _server(docs)
    effective, _ = _print_config(docs, tmp_path)
    assert effective["memory_backing"] == "hugetlb" and effective["prealloc"] == "auto"
    assert _bytes(c["resources"]["limits"]["hugepages-2Mi"]) >= _bytes(effective["memory_budget"])
    # The other overlays keep 4 KiB pages (auto) and ask for no huge pages.
    for target in ("overlays/cluster-mysql", "overlays/single-node", "overlays/rdma"):
        _, other = _server(_render(target))
        assert "hugepages-2Mi" not in other["resources"]["limits"]


def _s3_secret_refs(container) -> dict[str, dict]:
    """The container's variables taken from the S3 Secret: name -> secretKeyRef."""
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", [])
            if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == S3_SECRET}


def test_the_s3_overlay_maps_the_checkpoints_to_the_bucket_with_keys_from_the_secret():
    docs = _render("overlays/s3")
    ds, c = _server(docs)
    settings = _settings(docs)
    # The path the training pods save under is the bucket's prefix.
    [(root, bucket)] = _roots(settings["storage_roots"])
    assert bucket == "s3://your-bucket/tce"
    _, train = _job(docs)
    assert "--save_dir %s/" % root in train["args"][0]
    assert settings["s3_region"] == "us-east-1" and settings["s3_endpoint"] == ""
    assert settings["s3_path_style"] in ("true", "false")
    # The keys: environment variables from the Secret, by reference (the
    # session token only where the Secret has one); no credentials file.
    refs = _s3_secret_refs(c)
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": S3_SECRET, "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": S3_SECRET, "key": "AWS_SECRET_ACCESS_KEY"},
        "AWS_SESSION_TOKEN": {"name": S3_SECRET, "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    assert not settings.get("s3_credentials_file")
    assert not any(e["name"].startswith("AWS_") and "value" in e for e in c["env"]), "a key written inline"
    # No secret in the rendered manifests: no Secret (the example is not
    # applied), and no ConfigMap that holds or names a key.
    assert not any(d["kind"] == "Secret" for d in docs)
    example = yaml.safe_load(open(S3_SECRET_EXAMPLE))
    values = [*SECRETS.values(), *example["stringData"].values()]
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        for key, text in cm["data"].items():
            assert not any(v in text for v in values), (cm["metadata"]["name"], key)
            assert not re.search(r"(?i)aws_(access_key_id|secret_access_key|session_token)", text), \
                (cm["metadata"]["name"], key)
    rendered = _rendered["overlays/s3"]
    assert not any(v in rendered for v in example["stringData"].values())
    # No node mounts the checkpoints: the server writes the bucket, and the
    # training pods keep what DeepSpeed writes itself in an emptyDir. A save
    # the server cannot take raises: a fallback would vanish with the pod.
    assert all(v.get("hostPath", {}).get("path") != root for v in ds["spec"]["template"]["spec"]["volumes"])
    assert _by_name(train["env"])["TCE_ON_UNAVAILABLE"]["value"] == "raise"
    # The other overlays keep the filesystem and take no S3 keys.
    for target in ("overlays/cluster-mysql", "overlays/single-node", "overlays/rdma", "overlays/hugepages"):
        other = _render(target)
        assert [b for _, b in _roots(_settings(other)["storage_roots"])] == [None]
        _, oc = _server(other)
        assert not _s3_secret_refs(oc) and not any(e["name"].startswith("AWS_") for e in oc.get("env", []))


def test_the_example_s3_secret_is_valid_fits_the_overlay_and_is_not_applied():
    secret = yaml.safe_load(open(S3_SECRET_EXAMPLE))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == S3_SECRET
    assert secret["metadata"]["namespace"] == "tce-system"
    # It has the keys the DaemonSet requires, only keys it reads, and only
    # placeholders for values.
    _, c = _server(_render("overlays/s3"))
    refs = _s3_secret_refs(c)
    required = {r["key"] for r in refs.values() if not r.get("optional")}
    assert required <= set(secret["stringData"]) <= {r["key"] for r in refs.values()}
    assert all(v.startswith("REPLACE_WITH_") for v in secret["stringData"].values()), secret["stringData"]
    # No kustomization applies it.
    for root, _, files in os.walk(DEPLOY):
        if "kustomization.yaml" in files:
            k = yaml.safe_load(open(os.path.join(root, "kustomization.yaml")))
            named = [f for field in ("resources", "patchesStrategicMerge") for f in k.get(field, [])]
            assert not any(os.path.basename(f) == "secret.example.yaml" for f in named), root


def test_the_server_takes_the_s3_overlay_and_prints_no_key(tmp_path):
    """The real server's --print-config with the s3 overlay's ConfigMap and
    environment (the Secret's keys as stand-ins): the S3 root and settings
    as given, and not one key in what it prints."""
    _skip_without_s3("overlays/s3")
    docs = _render("overlays/s3")
    printed: list[str] = []
    effective, given = _print_config(docs, tmp_path, printed)
    assert effective["storage_roots"] == given["TCE_STORAGE_ROOTS"]
    assert effective["s3_region"] == given["TCE_S3_REGION"]
    assert effective["s3_path_style"] == given["TCE_S3_PATH_STYLE"]
    for (name, _), value in SECRETS.items():
        if name == S3_SECRET:
            assert value not in printed[0], "a key printed"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make setup` installs it (Debian's prometheus)"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def _alert_rules() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(open(ALERTS))["groups"] for r in g["rules"]}


def test_the_alert_rules_pass_promtool_check():
    p = _promtool("check", "rules", ALERTS)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(_alert_rules())} rules found" in p.stdout, p.stdout


def test_every_alert_says_how_long_how_bad_and_what_to_do():
    rules = _alert_rules()
    assert {"TCEBackupsFailing", "TCEPersistenceFailing", "TCECacheFull"} <= set(rules)
    doc = open(OPERATIONS_DOC).read()
    for name, rule in rules.items():
        assert re.fullmatch(r"\d+m", rule.get("for", "")), f"{name}: no `for`, it would page on one scrape"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 100, name
        assert f"`{name}`" in doc, f"{name} is not in docs/operations.md's Alerts"


def test_the_alert_rules_pass_their_unit_tests():
    """promtool replays the series of tce-alerts.test.yaml through the rules;
    every alert has a case where it fires and a case where it must not."""
    p = _promtool("test", "rules", ALERT_TESTS)
    assert p.returncode == 0, p.stdout + p.stderr
    fires, quiet = set(), set()
    for group in yaml.safe_load(open(ALERT_TESTS))["tests"]:
        for case in group["alert_rule_test"]:
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fires == quiet == set(_alert_rules()), (fires, quiet)


@pytest.mark.parametrize("broken, error", [
    ("expr: tce_backup_consecutive_failures >=", "could not parse expression"),
    ("exprr: tce_backup_consecutive_failures >= 3", "field exprr not found"),
])
def test_promtool_check_rejects_a_broken_rule(tmp_path, broken, error):
    """Proves the check above can fail."""
    text = open(ALERTS).read()
    good = "expr: tce_backup_consecutive_failures >= 3"
    assert text.count(good) == 1
    (tmp_path / "tce-alerts.yaml").write_text(text.replace(good, broken))
    p = _promtool("check", "rules", str(tmp_path / "tce-alerts.yaml"))
    assert p.returncode != 0 and error in p.stdout + p.stderr, p.stdout + p.stderr


def test_the_unit_tests_catch_an_alert_that_pages_a_healthy_node(tmp_path):
    """Proves the unit tests can fail: a TCECacheFull that ignores whether
    the cache could evict fires for a cache full of persisted files."""
    text = open(ALERTS).read()
    evictable = ('\n          and\n          (tce_persist_queue > 0 or sum without (state) '
                 '(tce_files{state="persisted"}) == 0)\n')
    assert text.count(evictable) == 1
    (tmp_path / "tce-alerts.yaml").write_text(text.replace(evictable, "\n"))
    shutil.copy(ALERT_TESTS, tmp_path)
    p = _promtool("test", "rules", str(tmp_path / os.path.basename(ALERT_TESTS)))
    assert p.returncode != 0, p.stdout
    assert 'alertname="TCECacheFull", instance="steady:9464"' in p.stdout + p.stderr, p.stdout + p.stderr


def _exported_samples() -> dict[str, list[dict[str, str]]]:
    """Every sample a real server's GET /metrics returns: name -> label sets."""
    with LocalServer(memory_budget="256MiB",
                     extra_args=["--memory-backing", "4k", "--metrics-listen", "127.0.0.1:0"]) as s:
        with _knobs.override(socket=s.socket):
            endpoint = api.status()["metrics_endpoint"]
            api.close()
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
            text = r.read().decode()
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


def test_the_alerts_name_only_metrics_the_server_exports():
    """Every tce_* name in the rules (expressions, annotations, comments) is a
    sample the real server exports; every `label="value"` a rule selects
    exists; the unit tests' series carry the labels the server gives them."""
    exported = _exported_samples()
    named = set(re.findall(r"\btce_[a-z0-9_]+", open(ALERTS).read()))
    assert named, "no tce_* metric in the rules"
    assert not named - set(exported), f"the server exports no {sorted(named - set(exported))}"
    for name, rule in _alert_rules().items():
        for metric, matchers in re.findall(r"\b(tce_[a-z0-9_]+)\{([^}]*)\}", rule["expr"]):
            for label, value in re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers):
                assert any(l.get(label) == value for l in exported[metric]), \
                    f'{name}: {metric} has no {label}="{value}": {exported[metric]}'
    for group in yaml.safe_load(open(ALERT_TESTS))["tests"]:
        for series in group["input_series"]:
            m = re.fullmatch(r"(\w+)\{(.*)\}", series["series"])
            if not m.group(1).startswith("tce_"):
                continue
            labels = set(re.findall(r"(\w+)\s*=", m.group(2))) - {"job", "instance"}
            assert m.group(1) in exported, f"{series['series']}: the server exports no {m.group(1)}"
            assert labels in [set(l) for l in exported[m.group(1)]], (series["series"], exported[m.group(1)])
