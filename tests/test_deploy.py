"""The Kubernetes manifests: deploy/ and each overlay render with kubectl's
kustomize, every rendered document validates against the Kubernetes schemas
(kubernetes-validate, strict), and the settings that must agree do: the
drain fits the grace period, the probes speak gRPC health on the health
port, the socket directory is shared, the memory limit holds the budget, the
ConfigMap and the DaemonSet's environment make a configuration the real
server accepts, and each overlay sets what it is for."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tce.tools._server import server_binary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
# The oldest Kubernetes the manifests target (gRPC probes are GA since 1.27),
# and the newest the validator knows.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
TARGETS = [".", "base", "overlays/single-node", "overlays/cluster-mysql", "overlays/rdma",
           "overlays/hugepages"]
CLUSTER = ["overlays/cluster-mysql", "overlays/rdma", "overlays/hugepages"]
CONFIG_PATH = "/etc/tce/tce.toml"  # where the DaemonSet mounts the ConfigMap
# What the kubelet would put in the server's environment (stand-ins).
NODE_IP = "10.0.0.7"
SECRETS = {("tce-mysql", "url"): "mysql://tce:s3cret@mysql.example.com:3306/tce"}
# The only kustomization fields used: Debian 12's kubectl 1.20 (kustomize
# v2.0.3) must render the same files as a current kubectl.
KUSTOMIZE_V2_FIELDS = {"apiVersion", "kind", "namespace", "resources", "bases", "configMapGenerator",
                       "patchesStrategicMerge", "images"}

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


def _print_config(docs, tmp_path) -> tuple[dict[str, str], dict[str, str]]:
    """Runs the real server with the DaemonSet's args and environment and the
    ConfigMap as its config file, with --print-config. Returns (the effective
    configuration, the TCE_* environment given)."""
    _, c = _server(docs)
    config = tmp_path / "tce.toml"
    config.write_text(_config_text(docs))
    args = [str(config) if a == CONFIG_PATH else a for a in c.get("args", [])]
    assert str(config) in args, f"the server is not pointed at the ConfigMap: {c.get('args')}"
    given = {k: v for k, v in _kubelet_env(c).items() if k.startswith("TCE_")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCE_")}
    p = subprocess.run([server_binary(), *args, "--print-config"], capture_output=True, text=True,
                       timeout=60, env={**env, **given})
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
        ["Namespace", "ServiceAccount", "ConfigMap", "ConfigMap", "DaemonSet", "Service", "Job"])
    for d in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(d, version, strict=True)  # raises on any error
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "tce-system", d["metadata"]


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
    assert len(found) == len(TARGETS), found


@pytest.mark.parametrize("target", TARGETS)
def test_the_server_accepts_the_config_map_and_the_environment(target, tmp_path):
    docs = _render(target)
    effective, given = _print_config(docs, tmp_path)
    assert effective["socket"] == "/run/tce/tce.sock"
    assert effective["health_listen"] == "0.0.0.0:7071"
    assert effective["metrics_listen"] == "0.0.0.0:9464"
    assert effective["log_format"] == "json"
    assert effective["storage_roots"] == "/mnt/checkpoints"
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
    # The storage: the same node path at the same place, so a file the
    # client names is the file the server persists.
    assert _mounts(server)["checkpoints"] == _mounts(train)["checkpoints"] == config["storage_roots"]
    assert server_vols["checkpoints"]["hostPath"]["path"] == job_vols["checkpoints"]["hostPath"]["path"]
    assert train["args"][0].count("--save_dir " + config["storage_roots"] + "/") == 1
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
    # What the server makes of it: MySQL, and this node's address for peers.
    effective, _ = _print_config(docs, tmp_path)
    url = SECRETS[("tce-mysql", "url")]
    assert effective["metadata_url"] == _redacted(url) != url  # the password is never printed
    assert effective["peer_advertise"] == NODE_IP + ":7070"
    assert effective["peer_token_file"] == "/etc/tce-peer/token"
    # Every node of the job runs its rank.
    job, train = _job(docs)
    assert job["spec"]["completions"] == 2 and "--nnodes=2 " in train["args"][0]


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
