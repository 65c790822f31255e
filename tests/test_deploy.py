"""The Kubernetes manifests: deploy/ and each overlay render with kubectl's
kustomize, every rendered document validates against the Kubernetes schemas
(kubernetes-validate, strict), and the settings that must agree do: the
drain fits the grace period, the probes speak gRPC health on the health
port, the socket directory is shared, the ConfigMap is a config the real
server accepts, and each overlay sets what it is for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tce._server import server_binary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
K8S_VERSION = "1.30.0"
TARGETS = [".", "base", "overlays/single-node", "overlays/cluster-mysql", "overlays/rdma"]

pytestmark = pytest.mark.deploy


def _render(target: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: `make setup` installs it"
    p = subprocess.run([kubectl, "kustomize", os.path.join(DEPLOY, target)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def _server(docs):
    ds = _one(docs, "DaemonSet", "tce-server")
    return ds, ds["spec"]["template"]["spec"]["containers"][0]


def _env(container) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _config_text(docs) -> str:
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tce-server-config")]
    assert len(cms) == 1
    return cms[0]["data"]["tce.toml"]


def _memory_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", q)
    assert m, q
    return int(m.group(1)) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[m.group(2)]


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_manifest_validates(target):
    docs = _render(target)
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service", "Job"}
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)  # raises on any error
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "tce-system", d["metadata"]


def test_the_validator_rejects_a_misspelled_field():
    """Proves the validation above can fail: strict mode knows the schema."""
    ds, container = _server(_render("base"))
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_the_config_map_is_a_config_the_server_accepts(target, tmp_path):
    config = tmp_path / "tce.toml"
    config.write_text(_config_text(_render(target)))
    p = subprocess.run([server_binary(), "--config", str(config), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for line in ('socket = "/run/tce/tce.sock"', 'metrics_listen = "0.0.0.0:9464"',
                 'health_listen = "0.0.0.0:7071"', 'log_format = "json"', "drain_timeout_ms = 25000",
                 'storage_roots = "/mnt/checkpoints"', 'memory_budget = "auto"'):
        assert line in p.stdout.splitlines(), p.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_daemonset_settings_agree_with_the_server_config(target):
    docs = _render(target)
    ds, c = _server(docs)
    pod = ds["spec"]["template"]["spec"]
    drain_ms = int(re.search(r"^drain_timeout_ms = (\d+)$", _config_text(docs), re.M).group(1))
    assert pod["terminationGracePeriodSeconds"] * 1000 >= drain_ms + 5000
    # Probes: the standard gRPC health service on the health port, readiness
    # on "" (drops when a drain begins), liveness on "liveness" (never kills a drain).
    health_port = {p["name"]: p["containerPort"] for p in c["ports"]}["health"]
    assert c["readinessProbe"]["grpc"] == {"port": health_port, "service": ""}
    assert c["livenessProbe"]["grpc"] == {"port": health_port, "service": "liveness"}
    assert 'health_listen = "0.0.0.0:%d"' % health_port in _config_text(docs)
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert 'metrics_listen = "0.0.0.0:%s"' % ann["prometheus.io/port"] in _config_text(docs)
    # Memory: requests == limits, and budget "auto" = 90% of the limit.
    res = c["resources"]
    assert res["requests"]["memory"] == res["limits"]["memory"]
    assert _memory_bytes(res["limits"]["memory"]) >= 8 << 30
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    assert pod["hostNetwork"] is True
    assert c["image"] == "localhost/tce-server:latest"
    # The socket directory: one hostPath, mounted where the config says.
    server_sockets = {v["name"]: v for v in pod["volumes"]}["sockets"]["hostPath"]["path"]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["sockets"] == "/run/tce"
    job = _one(docs, "Job", "example-train")
    jpod = job["spec"]["template"]["spec"]
    assert {v["name"]: v for v in jpod["volumes"]}["tce-sockets"]["hostPath"]["path"] == server_sockets
    train = jpod["containers"][0]
    assert {m["name"]: m["mountPath"] for m in train["volumeMounts"]}["tce-sockets"] == "/run/tce"
    assert _env(train)["TCE_SOCKET"]["value"] == "/run/tce/tce.sock"
    assert jpod["nodeSelector"] == pod["nodeSelector"] or pod["nodeSelector"].items() >= jpod["nodeSelector"].items()
    # The DeepSpeed config the job mounts selects the TCE engine.
    import json

    ds_cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("deepspeed-config")][0]
    assert {v["name"]: v for v in jpod["volumes"]}["deepspeed-config"]["configMap"]["name"] == ds_cm["metadata"]["name"]
    assert json.loads(ds_cm["data"]["ds_config.json"])["checkpoint_engine"] == "tce"


def test_single_node_has_no_ring_and_keeps_sqlite():
    for target in (".", "overlays/single-node"):
        docs = _render(target)
        _, c = _server(docs)
        env = _env(c)
        assert "TCE_PEER_LISTEN" not in env and "TCE_METADATA_URL" not in env
        assert "peer_listen" not in _config_text(docs) and "metadata_url" not in _config_text(docs)
        assert _one(docs, "Job")["spec"]["completions"] == 1


@pytest.mark.parametrize("target", ["overlays/cluster-mysql", "overlays/rdma"])
def test_cluster_overlays_take_secrets_and_join_the_ring(target):
    docs = _render(target)
    ds, c = _server(docs)
    env = _env(c)
    assert env["TCE_METADATA_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tce-mysql", "key": "url"}
    assert env["TCE_PEER_LISTEN"]["value"] == "0.0.0.0:7070"
    assert env["TCE_PEER_ADVERTISE"]["value"] == "$(NODE_IP):7070"
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    names = [e["name"] for e in c["env"]]
    assert names.index("NODE_IP") < names.index("TCE_PEER_ADVERTISE"), "$(NODE_IP) would not expand"
    token_dir = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["peer-token"]
    assert env["TCE_PEER_TOKEN_FILE"]["value"] == token_dir + "/token"
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["peer-token"]["secret"]["secretName"] == "tce-peer-token"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["peer"] == 7070
    assert not any(d["kind"] == "Secret" for d in docs), "secrets are the admin's, never in the repo"


def test_the_rdma_overlay_uses_ofi_verbs_and_asks_for_the_device():
    _, c = _server(_render("overlays/rdma"))
    env = _env(c)
    assert env["TCE_RING_TRANSPORT"]["value"] == "ofi"
    assert env["TCE_OFI_PROVIDER"]["value"] == "verbs"
    assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    # The same environment is a valid server configuration.
    p = subprocess.run([server_binary(), "--print-config"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TCE_RING_TRANSPORT="ofi", TCE_OFI_PROVIDER="verbs",
                                TCE_PEER_LISTEN="0.0.0.0:7070", TCE_PEER_ADVERTISE="10.0.0.1:7070"))
    assert p.returncode == 0 and 'ring_transport = "ofi"' in p.stdout, p.stderr
