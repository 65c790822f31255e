"""The Grafana dashboard (deploy/grafana/tce-dashboard.json): every panel
has a title and a unit and queries only metrics, and label values, that the
real server exports; and with Debian's Prometheus scraping two real servers
in a ring, after saves, persistence, a backup, a load and a published
version with a reader a version behind, every panel's query returns data (and the panels of
the work done show it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest
import torch

import tce
from tce import _service, api, weights
from tce.core import _knobs
from tce.tools._ports import free_port
from tce.tools._server import LocalServer
from helpers import until

pytestmark = pytest.mark.deploy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "tce-dashboard.json")
TOKEN = "dashboard-ring-token"
JOB = "dash-job"
# What Grafana puts for its built-in interval: a window that holds the
# whole test (the scrapes are 1 s apart).
RATE_INTERVAL = "1m"
# Panels whose series must show the work the live test does (above 0 on
# some series); the others (failures, object storage, evictions, queues
# drained by then) need only return data.
SHOW_WORK = {"Servers up", "Client sessions", "Cache memory vs budget", "Files by state", "Saves",
             "Persisted", "Persisted files", "Persist latency", "Backed up", "Backup latency",
             "Held for the predecessor", "Client records vs budget", "Mapped files", "Versions published",
             "Version readers", "Readers' lag", "Loads by source"}


def _dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def _panels(dash: dict) -> list[dict]:
    """The panels that draw (rows hold others; a collapsed row's are inside it)."""
    out = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def _variables(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def _metrics_text(endpoint: str) -> str:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        return r.read().decode()


def _exported(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it has (histograms: _bucket, _sum, _count)."""
    out: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            out.setdefault(m.group(1), []).append(dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
    return out


def _selectors(expr: str) -> list[tuple[str, str]]:
    """Each tce_* metric an expression names, with its matchers ("" if none)."""
    return re.findall(r"\b(tce_[a-z0-9_]+)(?:\{([^}]*)\})?", expr)


def _problems(dash: dict, exported: dict[str, list[dict[str, str]]]) -> list[str]:
    """What in the dashboard does not fit the server's metrics or Grafana's rules."""
    bad = []
    variables = _variables(dash)
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        bad.append("no `datasource` variable of Prometheus data sources")
    node = variables.get("node", {})
    node_metric = re.fullmatch(r"label_values\((\w+), instance\)", node.get("definition", ""))
    if not node_metric or node_metric.group(1) not in exported:
        bad.append(f"the `node` variable lists no exported metric's instances: {node.get('definition')}")
    panels = _panels(dash)
    if len({p["id"] for p in panels}) != len(panels):
        bad.append("panel ids repeat")
    for p in panels:
        where = f"panel {p.get('title')!r}"
        if not p.get("title"):
            bad.append(f"panel {p['id']} has no title")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            bad.append(f"{where} has no unit")
        if p.get("datasource", {}).get("uid") != "${datasource}":
            bad.append(f"{where} does not use the `datasource` variable")
        if not p.get("targets"):
            bad.append(f"{where} has no query")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                bad.append(f"{where} {t['refId']}: not on the `datasource` variable")
            selectors = _selectors(t["expr"])
            if not selectors:
                bad.append(f"{where} {t['refId']}: names no tce_* metric: {t['expr']}")
            for metric, matchers in selectors:
                if metric not in exported:
                    bad.append(f"{where} {t['refId']}: the server exports no {metric}")
                    continue
                if 'instance=~"$node"' not in matchers:
                    bad.append(f'{where} {t["refId"]}: {metric} is not limited to instance=~"$node"')
                for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
                    if label == "instance":
                        continue
                    for v in value.split("|") if op == "=~" else [value]:
                        if not any(labels.get(label) == v for labels in exported[metric]):
                            bad.append(f'{where} {t["refId"]}: {metric} has no {label}="{v}"')
    return bad


def _ring_server(tmp_path, name: str, *, storage=None) -> LocalServer:
    state = tmp_path / name
    state.mkdir()
    args = ["--peer-listen", "127.0.0.1:0", "--peer-token", TOKEN, "--peer-timeout-ms", "2000",
            "--ring-transport", "tcp", "--state-dir", str(state), "--memory-backing", "4k",
            "--metrics-listen", "127.0.0.1:0"]
    return LocalServer(memory_budget="256MiB", socket_path=str(state / "tce.sock"),
                       storage_roots=[str(storage)] if storage else [], extra_args=args).start()


def _status(server: LocalServer) -> dict:
    with _knobs.override(socket=server.socket):
        st = api.status()
        api.close()
    return st


class _Prometheus:
    """Debian's prometheus on loopback, scraping `targets` every second,
    with its data in `directory`."""

    def __init__(self, directory, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `make setup` installs it (Debian's prometheus)"
        config = directory / "prometheus.yml"
        config.write_text(json.dumps({  # (JSON is YAML)
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "tce", "static_configs": [{"targets": targets}]}]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = directory / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        until(self._ready, 60, "prometheus to start")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def get(self, path: str, **params: str) -> list:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}",
                                    timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_every_panel_has_a_title_a_unit_and_exported_metrics(tmp_path):
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36, dash.get("schemaVersion")
    (tmp_path / "ckpt").mkdir()  # a storage root: the per-root families are exported for each root
    with LocalServer(memory_budget="256MiB", storage_roots=[str(tmp_path / "ckpt")],
                     extra_args=["--memory-backing", "4k", "--metrics-listen", "127.0.0.1:0"]) as s:
        with _knobs.override(socket=s.socket, job=JOB, on_unavailable="raise"):  # a version with a reader:
            tce.save({"w": torch.ones(4)}, tmp_path / "ckpt" / "model.pt", tag="step1")  # the per-job families
            weights.publish("step1")
            with weights.open():
                exported = _exported(_metrics_text(api.status()["metrics_endpoint"]))
            api.close()
    assert "tce_up" in exported and "tce_persist_seconds_bucket" in exported, sorted(exported)
    assert _problems(dash, exported) == []


def test_the_check_finds_a_metric_the_server_does_not_export():
    """The check above can fail: a query of a name, or a label value, that
    is not exported, and a panel without a unit, are each reported."""
    dash = _dashboard()
    exported = {"tce_up": [{"version": "1"}], "tce_files": [{"state": "cached"}]}
    panels = _panels(dash)
    panels[0]["targets"] = [{"refId": "A", "datasource": {"uid": "${datasource}"},
                             "expr": 'tce_files{instance=~"$node",state="gone"} + tce_nonesuch{instance=~"$node"}'}]
    del panels[0]["fieldConfig"]["defaults"]["unit"]
    problems = _problems(dash, exported)
    title = panels[0]["title"]
    assert f"panel {title!r} has no unit" in problems
    assert f'panel {title!r} A: tce_files has no state="gone"' in problems
    assert f"panel {title!r} A: the server exports no tce_nonesuch" in problems


def _substituted(expr: str, nodes: list[str]) -> str:
    """The query Grafana sends with every node chosen (a regex of the values)."""
    return expr.replace("$node", "(" + "|".join(nodes) + ")").replace("$__rate_interval", RATE_INTERVAL)


def _panel_shows(prom: _Prometheus, exprs: list[str], work: bool) -> bool:
    """Every query returns data; with `work`, some series is above 0."""
    results = [prom.query(e) for e in exprs]
    if not all(results):
        return False
    return not work or any(float(r["value"][1]) > 0 for result in results for r in result)  # (NaN > 0: False)


def test_every_panel_shows_data_from_real_servers(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    a = _ring_server(tmp_path, "a", storage=storage)
    b = _ring_server(tmp_path, "b")
    prom = None
    reader = None
    try:
        endpoints = [_status(s)["peer_endpoint"] for s in (a, b)]
        for rank, s in enumerate((a, b)):
            with _knobs.override(socket=s.socket):
                _service.client().set_ring(JOB, rank, endpoints)
                api.close()
        scraped = sorted(_status(s)["metrics_endpoint"] for s in (a, b))
        (tmp_path / "prom").mkdir()
        prom = _Prometheus(tmp_path / "prom", scraped)
        # Scraped before the work starts: the counters' rates see it happen.
        until(lambda: len([r for r in prom.query("tce_up") if r["value"][1] == "1"]) == 2, 60,
              "prometheus to scrape both servers")

        sd = {"w": torch.randn(1 << 18), "b": torch.arange(1000)}
        with _knobs.override(socket=a.socket, job=JOB, on_unavailable="raise"):
            tce.save(sd, storage / "model.pt", tag="step1")
            tce.wait()  # persisted
            until(lambda: int(tce.status()["backed_up_files"]) == 1, 60, "the backup to the next node")
            assert torch.equal(tce.load(storage / "model.pt")["w"], sd["w"])
            assert weights.publish("step1").version == 1
            reader = weights.open()
            assert torch.equal(reader.state_dict()["w"], sd["w"])
            tce.save(sd, storage / "model2.pt", tag="step2")  # a newer version: the reader lags by one
            assert weights.publish("step2").version == 2
            until(lambda: [int(r["newest_version"]) - int(r["oldest_leased"])
                           for r in tce.status().get("version_readers", [])] == [1], 60, "the reader's lag")

            dash = _dashboard()
            node = _variables(dash)["node"]["definition"]
            metric = re.fullmatch(r"label_values\((\w+), instance\)", node).group(1)
            nodes = prom.get("/api/v1/label/instance/values", **{"match[]": metric})
            assert sorted(nodes) == scraped
            for panel in _panels(dash):
                exprs = [_substituted(t["expr"], nodes) for t in panel["targets"]]
                until(lambda: _panel_shows(prom, exprs, panel["title"] in SHOW_WORK), 30,
                      f"panel {panel['title']!r}: data from every query {exprs}" +
                      (" and the work done" if panel["title"] in SHOW_WORK else ""))
            reader.close()
            reader = None
            api.close()
    finally:
        if reader is not None:
            reader.close()
        api.close()
        if prom is not None:
            prom.stop()
        for s in (a, b):
            code = s.stop()
            s.cleanup()
            assert code == 0, s.log()
