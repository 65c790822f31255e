"""Node certificates on the ring: with peer_cert_file, peer_key_file and
peer_ca_file, a peer proves which node it is by signing the handshake with
its node's key; the token and the node's address are not enough.

Certificates are made here with the openssl command (a throwaway CA, EC
P-256 keys, IP subject alternative names). Nodes are 127.0.0.2 and
127.0.0.3 on loopback; the attacker connects from 127.0.0.2, A's own
address, which is what a token holder that can take A's address (or sits
behind it) would do.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import torch

from helpers import until
from hostile_peer import connect_with_cert, frame, recv_msg
from tce.tools._server import server_binary
from tce.v1 import tce_pb2 as pb
from test_ring import TOKEN, _ring_server, _status, _stop
from test_ring_security import JOB, _save, _set_ring


def _openssl(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["openssl", *args], input=data, capture_output=True, check=True).stdout


class Pki:
    """A CA in `d`, and certificates it signs, each (cert.pem, key.pem)."""

    def __init__(self, d: pathlib.Path, name: str) -> None:
        self.d = d
        self.key, self.pem = d / f"{name}-ca.key", d / f"{name}-ca.pem"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", str(self.key), "-out", str(self.pem), "-days", "2", "-subj", f"/CN={name}-ca")

    def node(self, name: str, ip: str) -> tuple[pathlib.Path, pathlib.Path]:
        key, csr, pem = self.d / f"{name}.key", self.d / f"{name}.csr", self.d / f"{name}.pem"
        ext = self.d / f"{name}.ext"
        ext.write_text(f"subjectAltName=IP:{ip}\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.pem), "-CAkey", str(self.key),
                 "-CAcreateserial", "-out", str(pem), "-days", "2", "-extfile", str(ext))
        return pem, key


def _der(pem: pathlib.Path) -> bytes:
    return _openssl("x509", "-in", str(pem), "-outform", "DER")


def _signer(key: pathlib.Path):
    return lambda data: _openssl("dgst", "-sha256", "-sign", str(key), data=data)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    cluster, other = Pki(d, "cluster"), Pki(d, "other")
    return {"ca": cluster.pem, "a": cluster.node("a", "127.0.0.2"), "b": cluster.node("b", "127.0.0.3"),
            "elsewhere": cluster.node("elsewhere", "127.0.0.9"),
            "forged_a": other.node("forged-a", "127.0.0.2"), "other_ca": other.pem}


def _cert_args(pki, node: str) -> list[str]:
    pem, key = pki[node]
    return ["--peer-cert-file", str(pem), "--peer-key-file", str(key), "--peer-ca-file", str(pki["ca"])]


def _ring_of_two(tmp_path, extra_a: list[str], extra_b: list[str]):
    """A (127.0.0.2) and B (127.0.0.3) in the job's ring, A node 0: (a, b,
    A's endpoint, B's endpoint). Both stopped on failure."""
    a = _ring_server(tmp_path, "tcp", "a", listen="127.0.0.2:0", extra=extra_a)
    try:
        b = _ring_server(tmp_path, "tcp", "b", listen="127.0.0.3:0", extra=extra_b)
    except BaseException:
        _stop(a)
        raise
    try:
        ea, eb = _status(a)["peer_endpoint"], _status(b)["peer_endpoint"]
        _set_ring(a, 0, [ea, eb])
        _set_ring(b, 1, [ea, eb])
    except BaseException:
        _stop(a, b)
        raise
    return a, b, ea, eb


def test_with_node_certificates_only_the_node_itself_is_let_in(tmp_path, pki):
    """A (127.0.0.2) and B (127.0.0.3) with node certificates back up as
    usual. From A's own address, with the token, a connection announcing A
    is refused when it shows no certificate, one from another CA, the
    cluster's certificate of another host, or A's certificate without A's
    key; with A's certificate and key it is let in. B holds A's copy alone."""
    a, b, ea, eb = _ring_of_two(tmp_path, _cert_args(pki, "a"), _cert_args(pki, "b"))
    try:
        _save(a, "/ckpt/certs/x.pt", {"w": torch.ones(1000)})
        until(lambda: int(_status(b)["held_backups"]) == 1, what="B to hold A's copy")

        a_pem, a_key = pki["a"]
        attempts = {
            "no certificate": (None, _signer(a_key), "has no node certificate and this server requires one"),
            "another CA": (_der(pki["forged_a"][0]), _signer(pki["forged_a"][1]),
                           "does not chain to the cluster CA"),
            "another host": (_der(pki["elsewhere"][0]), _signer(pki["elsewhere"][1]),
                             "its certificate does not name 127.0.0.2"),
            "A's certificate, another key": (_der(a_pem), _signer(pki["b"][1]),
                                             "its signature of this handshake is not its certificate's"),
        }
        for name, (der, sign, logged) in attempts.items():
            with pytest.raises(PermissionError):
                connect_with_cert(eb, TOKEN, ea, source="127.0.0.2", cert_der=der, sign=sign)
            until(lambda: logged in b.log(), what=f"B to refuse {name}: {logged}")

        member = connect_with_cert(eb, TOKEN, ea, source="127.0.0.2", cert_der=_der(a_pem), sign=_signer(a_key))
        try:
            member.sendall(frame(pb.PeerRequest(list=pb.PeerList(job=JOB, owner_node=0, job_uid=0))))
            listed = recv_msg(member, pb.PeerListReply)
            assert listed.code == 0 and [f.path for f in listed.files] == ["/ckpt/certs/x.pt"], listed
        finally:
            member.close()
        assert int(_status(b)["held_backups"]) == 1
    finally:
        _stop(a, b)


def test_a_node_with_a_certificate_and_one_without_do_not_talk(tmp_path, pki):
    """A cluster uses node certificates on every node or none: a backup from
    a node without one to a node with one fails, and both say why."""
    a, b, _, _ = _ring_of_two(tmp_path, [], _cert_args(pki, "b"))
    try:
        _save(a, "/ckpt/certs/y.pt", {"w": torch.ones(10)})
        until(lambda: "proves its node with a certificate and this server has none" in a.log(),
              what="A to say why it cannot back up")
        until(lambda: "has no node certificate and this server requires one" in b.log(),
              what="B to refuse A")
        assert int(_status(b)["held_backups"]) == 0
    finally:
        _stop(a, b)


@pytest.mark.parametrize("case", ["incomplete", "wrong key", "another CA"])
def test_node_certificate_settings_are_checked_at_start(tmp_path, pki, case):
    pem, key = pki["a"]
    args = {"incomplete": ["--peer-cert-file", str(pem), "--peer-key-file", str(key)],
            "wrong key": ["--peer-cert-file", str(pem), "--peer-key-file", str(pki["b"][1]),
                          "--peer-ca-file", str(pki["ca"])],
            "another CA": ["--peer-cert-file", str(pem), "--peer-key-file", str(key),
                           "--peer-ca-file", str(pki["other_ca"])]}[case]
    said = {"incomplete": "node certificates need peer_cert_file, peer_key_file and peer_ca_file, all three",
            "wrong key": f"peer_key_file: {pki['b'][1]} is not the key of the certificate in {pem}",
            "another CA": f"peer_cert_file: {pem}: its certificate does not chain to the cluster CA"}[case]
    p = subprocess.run([server_binary(), "--socket", str(tmp_path / "t.sock"), "--metadata-url", "none",
                        "--peer-listen", "127.0.0.1:0", "--peer-token", TOKEN, *args],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stdout + p.stderr
    assert said in p.stderr + p.stdout, p.stdout + p.stderr
