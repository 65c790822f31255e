"""How a node that follows jobs (docs/weights.md#other-nodes) asks its
sources when they do not answer: `tce status` per job, in the human and
the JSON output, and the caller's deadline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tce
from tce import _service, weights
from tce.core import _knobs
from tce.errors import DeadlineExceededError

from helpers import until
from hostile_peer import SilentPeer
from tce.v1 import tce_pb2 as pb
from test_ring import TOKEN, _ring_server, _status, _stop


def _tce(*args: str, socket: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tce.cli", "--socket", socket, *args],
                          capture_output=True, text=True, timeout=120)


def test_status_shows_a_job_its_source_does_not_know_as_retrying_with_the_reason(tmp_path):
    """A node follows a job name its source does not know (a typo): the
    follow is kept, and `tce status` says it is retrying, after how many
    rounds, why, and when it asks next."""
    source = _ring_server(tmp_path, "tcp", "source", listen="127.0.0.2:0")
    node = _ring_server(tmp_path, "tcp", "node", listen="127.0.0.3:0")
    try:
        src = _status(source)["peer_endpoint"]
        with _knobs.override(socket=node.socket, job="rl-runn", on_unavailable="raise"):
            assert weights.follow(sources=[src]) is None
            tce.close()
        followed = until(lambda: [f for f in _status(node).get("followed_jobs", []) if int(f["failures"])],
                         what="a failed round")
        st = json.loads(_tce("status", "--json", socket=node.socket).stdout)
        [f] = st["followed_jobs"]
        assert (f["job"], f["sources"], f["version"]) == ("rl-runn", [src], "0")
        assert f["state"] == "FOLLOW_STATE_RETRYING" and int(f["failures"]) >= 1, followed
        assert f["last_error"] == f"{src}: job 'rl-runn' has no published version here"
        assert 0 < f["retry_in_s"] <= 60
        human = _tce("status", socket=node.socket).stdout
        assert f"follow    job rl-runn: no version yet from {src}; RETRYING in " in human, human
        assert "(last: " + f["last_error"] + ")" in human
    finally:
        _stop(node, source)


def test_follow_gives_up_on_a_silent_source_by_the_callers_deadline(tmp_path):
    """A source that takes the question and never answers: Follow ends by
    its caller's deadline (DEADLINE_EXCEEDED, saying so) and lets go of the
    source then, not after the peer timeout."""
    node = _ring_server(tmp_path, "tcp", "node", listen="127.0.0.3:0",
                        extra=["--peer-timeout-ms", "600000"])
    silent = SilentPeer(TOKEN)
    try:
        with _knobs.override(socket=node.socket, job="rl-run", on_unavailable="raise"):
            c = _service.client()
            with pytest.raises(DeadlineExceededError) as e:
                c._call("Follow", pb.FollowRequest(session=c.session, job="rl-run", sources=[silent.endpoint]),
                        timeout=5)
            tce.close()
        assert silent.asked >= 1
        until(lambda: silent.closed >= 1, what="the node to let go of the silent source")
        assert "deadline" in str(e.value)
    finally:
        silent.close()
        _stop(node)
