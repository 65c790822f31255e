"""tce.weights: published versions read by inference processes (docs/weights.md).

A real server; versions published from files saved through the cache; the
readers are real processes where it matters (a reader of another uid is in
tests/test_security_local.py).
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

import tce
from tce import weights
from tce.core import _knobs
from tce.core._session import client
from tce.errors import DeadlineExceededError, FailedPreconditionError, NotCachedError
from helpers import until
from tce.tools._server import LocalServer


@pytest.fixture(autouse=True)
def own_job(request):
    """A job of its own per test: versions count from 1."""
    if "server" in request.fixturenames:
        request.getfixturevalue("server")  # (its own job setting comes first)
    with _knobs.override(job=f"w-{os.getpid()}-{request.node.name}"[:200]):
        yield


def api_close_and_stop(srv: LocalServer) -> None:
    tce.close()
    code = srv.stop()
    srv.cleanup()
    assert code == 0, srv.log()


def _stat(key: str) -> int:
    return int(tce.status()[key])  # (uint64 fields come as strings)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _scaled(m: torch.nn.Module, k: float) -> dict[str, torch.Tensor]:
    return {n: t * k for n, t in m.state_dict().items()}


def test_a_published_version_is_the_newest_and_reads_back_bitwise(server, tmp_path):
    assert weights.latest() is None
    sd = _scaled(_model(), 1.0)
    tce.save(sd, tmp_path / "model.pt", tag="step1")
    tce.save({"exp_avg": torch.ones(3)}, tmp_path / "optimizer.pt", tag="step1")
    info = weights.publish("step1")
    assert (info.version, info.tag) == (1, "step1")
    assert [p for _, p, _ in info.files] == [str(tmp_path / "model.pt"), str(tmp_path / "optimizer.pt")]
    assert weights.latest() == info
    with weights.open() as w:
        assert w.version == 1
        assert w.paths == [str(tmp_path / "model.pt")]  # the optimizer's file holds no weights
        got = w.state_dict()
    assert got.keys() == sd.keys()
    for name in sd:
        assert torch.equal(got[name], sd[name]), name


def test_tensors_view_the_cache_and_a_second_reader_copies_nothing_in_the_server(server, tmp_path):
    sd = {"w": torch.randn(1 << 18)}
    tce.save(sd, tmp_path / "big.pt", tag="s")
    weights.publish("s")
    before = {k: _stat(k) for k in ("version_leases", "buffers", "used_bytes")}
    with weights.open() as a, weights.open() as b:
        ta, tb = a.state_dict()["w"], b.state_dict()["w"]
        after = {k: _stat(k) for k in ("version_leases", "buffers", "used_bytes")}
        assert torch.equal(ta, sd["w"]) and torch.equal(tb, sd["w"])
        assert after["version_leases"] == before["version_leases"] + 2
    # Two readers, one copy of the bytes: no buffer was made for them.
    assert after["buffers"] == before["buffers"]
    assert after["used_bytes"] == before["used_bytes"]


def test_load_into_a_module_and_names_that_do_not_fit_are_refused(server, tmp_path):
    trained = _model()
    for p in trained.parameters():
        p.data.mul_(3)
    tce.save(trained.state_dict(), tmp_path / "m.pt", tag="v")
    weights.publish("v")
    fresh = _model()
    with weights.open() as w:
        loaded = w.load_into(fresh)
    assert sorted(loaded) == sorted(trained.state_dict())
    for (n, a), (_, b) in zip(trained.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n
    other = torch.nn.Linear(16, 4)
    with weights.open() as w, pytest.raises(tce.InvalidArgumentError, match="does not fit the module"):
        w.load_into(other)
    assert torch.equal(other.weight, other.weight)  # (untouched: nothing half-loaded)


def test_a_waiting_reader_is_answered_when_the_version_is_published(server, tmp_path):
    tce.save({"a": torch.zeros(4)}, tmp_path / "a.pt", tag="one")
    first = weights.publish("one")
    got: list = []
    t = threading.Thread(target=lambda: got.append(weights.wait_newer(after=first.version, timeout=120)))
    t.start()
    tce.save({"a": torch.ones(4)}, tmp_path / "a.pt", tag="two")
    weights.publish("two")
    t.join(timeout=120)
    assert [v.tag for v in got] == ["two"]
    assert got[0].version == first.version + 1
    with pytest.raises(DeadlineExceededError, match="newer than 2"):
        weights.wait_newer(after=2, timeout=0.2)


def test_a_leased_version_keeps_its_bytes_while_the_path_is_saved_again(server, tmp_path):
    path = tmp_path / "policy.pt"
    tce.save({"w": torch.full((1000,), 1.0)}, path, tag="v1")
    weights.publish("v1")
    w1 = weights.open()
    t1 = w1.state_dict()["w"]
    tce.save({"w": torch.full((1000,), 2.0)}, path, tag="v2")  # the same path, while leased
    weights.publish("v2")
    assert torch.equal(t1, torch.full((1000,), 1.0))
    with weights.open() as w2:
        assert torch.equal(w2.state_dict()["w"], torch.full((1000,), 2.0))
    with pytest.raises(FailedPreconditionError, match="is gone: .*policy.pt was saved again"):
        weights.open(version=w1.version)
    w1.close()
    del t1


def test_the_lease_ends_when_closed_and_every_tensor_is_gone(server, tmp_path):
    tce.save({"w": torch.ones(100)}, tmp_path / "x.pt", tag="v")
    weights.publish("v")
    base = _stat("version_leases")
    w = weights.open()
    t = w.state_dict()["w"]
    w.close()
    client().flush()
    assert _stat("version_leases") == base + 1  # a tensor still views it
    del t  # the last view: the release is queued, sent with the next call
    client().flush()
    assert _stat("version_leases") == base


def test_an_unrenewed_lease_times_out_and_its_memory_can_go(make_server, tmp_path):
    srv = make_server()
    with _knobs.override(socket=srv.socket, job="lease-timeout"):
        tce.save({"w": torch.ones(1000)}, tmp_path / "x.pt", tag="v")
        weights.publish("v")
        w = weights.open(lease_s=1)
        assert w.lease_s == 1
        until(lambda: _stat("version_leases") == 0, what="the lease to expire")
        assert _stat("leases") == 0
        with pytest.raises(NotCachedError, match="no version lease"):
            w.renew()
        w.close()


def test_publish_refuses_a_path_that_is_not_cached(server, tmp_path):
    with pytest.raises(NotCachedError, match="nothing of job .* is committed"):
        weights.publish("x", [tmp_path / "none.pt"])
    with pytest.raises(NotCachedError, match="no file of job"):
        weights.publish("no-such-tag")


def test_deepspeed_style_model_states_give_the_module_weights(server, tmp_path):
    sd = _scaled(_model(), 2.0)
    d = tmp_path / "global_step5"
    d.mkdir()
    tce.save({"module": sd, "optimizer": None, "global_steps": 5}, d / "mp_rank_00_model_states.pt",
             tag="global_step5")
    tce.save({"optimizer_state_dict": {"state": {}}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
             tag="global_step5")
    weights.publish("global_step5")
    with weights.open() as w:
        assert w.paths == [str(d / "mp_rank_00_model_states.pt")]
        got = w.state_dict()
    assert got.keys() == sd.keys()
    assert all(torch.equal(got[n], sd[n]) for n in sd)


def test_a_sharded_safetensors_version_from_save_pretrained(server, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(config)
    tce.patch_torch([tmp_path])
    try:
        model.save_pretrained(tmp_path / "v1", max_shard_size="100KB")
    finally:
        tce.unpatch_torch()
    info = weights.publish("v1", [tmp_path / "v1"])  # (memory only: nothing on disk)
    shards = sorted(p for _, p, _ in info.files)
    assert len(shards) == 6 and all(p.endswith(".safetensors") for p in shards)
    fresh = transformers.GPT2LMHeadModel(config)
    with weights.open() as w:
        names = {n for n, _ in w.tensors()}
        w.load_into(fresh, strict=False)
        assert "transformer.wte.weight" in names
    for name, t in model.state_dict().items():
        assert torch.equal(t, fresh.state_dict()[name]), name


def test_load_into_maps_a_reused_buffer_once_and_lets_go_when_it_goes(make_server, tmp_path):
    srv = make_server("1MiB")
    path = tmp_path / "policy.safetensors"
    from tce.integrations import safetensors as st
    target = {"w": torch.zeros(16384)}
    with _knobs.override(socket=srv.socket, job="kept"):
        c = client()
        seen = []
        for v in range(1, 5):  # the trainer's buffers alternate: v3 reuses v1's, v4 v2's
            st.save_file({"w": torch.full((16384,), float(v))}, path, tag=f"v{v}")
            weights.publish(f"v{v}")
            before = c.fd_requests
            with weights.open() as w:
                w.load_into(target)
                buffer = w._files[str(path)].buffer_id
            assert torch.equal(target["w"], torch.full((16384,), float(v)))
            seen.append((buffer, c.fd_requests - before))
        (b1, n1), (b2, n2), (b3, n3), (b4, n4) = seen
        assert (n1, n2) == (1, 1) and b1 != b2
        assert (b3, b4) == (b1, b2) and (n3, n4) == (0, 0), "a reused buffer is not mapped again"
        assert sorted(c._kept) == sorted([b1, b2])
        # The file goes and a save needs its room: both buffers are
        # destroyed, the server says so, and the client drops its mappings.
        tce.remove(path)
        tce.save({"big": torch.zeros((900 << 10) // 4)}, tmp_path / "big.pt", tag="x")
        assert c._kept == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_load_into_a_gpu_module_copies_from_the_registered_mapping(server, tmp_path):
    trained = _model()
    for p in trained.parameters():
        p.data.mul_(5)
    tce.save(trained.state_dict(), tmp_path / "m.pt", tag="v")
    weights.publish("v")
    fresh = _model().cuda()
    with weights.open() as w:
        w.load_into(fresh)
        buffer = w._files[str(tmp_path / "m.pt")].buffer_id
    kept = client()._kept[buffer]
    assert kept.cuda_registered, "the kept mapping is pinned (registered read-only)"
    for (n, a), (_, b) in zip(trained.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b.cpu()), n


def test_pinned_tensors_view_the_kept_mappings_of_the_version(server, tmp_path):
    """Without a GPU, pinned_tensors are the same bytes over the kept
    mappings (no registration), the version's own."""
    trained = _model()
    tce.save(trained.state_dict(), tmp_path / "m.pt", tag="v")
    weights.publish("v")
    with weights.open() as w:
        pinned = dict(w.pinned_tensors())
        buffer = w._files[str(tmp_path / "m.pt")].buffer_id
        kept = client()._kept[buffer].tensor
        for n, t in trained.state_dict().items():
            assert torch.equal(pinned[n], t), n
            start = pinned[n].untyped_storage().data_ptr()
            assert kept.data_ptr() <= start < kept.data_ptr() + kept.numel(), n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_engine_s_loader_reads_the_version_pinned_for_its_gpu(server, tmp_path):
    """What the vLLM backend hands a GPU engine's weight loaders
    (``pinned_tensors``): the kept read-only mappings, registered with CUDA
    once, so each copy to the device runs as DMA from pinned memory."""
    trained = _model()
    tce.save(trained.state_dict(), tmp_path / "m.pt", tag="v")
    weights.publish("v")
    with weights.open() as w:
        pinned = w.pinned_tensors()
        buffer = w._files[str(tmp_path / "m.pt")].buffer_id
        assert client()._kept[buffer].cuda_registered
        on_gpu = {n: t.to("cuda", non_blocking=True) for n, t in pinned}
        torch.cuda.synchronize()
    for n, t in trained.state_dict().items():
        assert torch.equal(on_gpu[n].cpu(), t), n


def test_an_evicted_version_comes_back_into_the_cache_once_for_every_reader(tmp_path):
    """Evicted for real (other saves need the memory): the first reader of
    the version has the server read the file back into its cache, still
    the version's; the next reader maps that copy. Storage is read once."""
    srv = LocalServer(memory_budget="40MiB", storage_roots=[str(tmp_path)],
                      extra_args=["--memory-backing", "4k"]).start()
    path = tmp_path / "m.pt"
    try:
        with _knobs.override(socket=srv.socket, job="evicted-once", on_unavailable="raise"):
            sd = {"w": torch.arange(3 << 20, dtype=torch.float32)}  # 12 MiB
            tce.save(sd, path, tag="v1")
            weights.publish("v1")
            tce.wait([path])
            with _knobs.override(job="filler"):  # 4 x 12 MiB more into 40 MiB
                for i in range(4):
                    tce.save({"x": torch.full((3 << 20,), float(i))}, tmp_path / f"f{i}.pt")
                    tce.wait()
            for reader in range(2):
                with weights.open() as w:
                    held = w._files[str(path)].buffer_id != 0
                    assert held == (reader == 1), reader  # evicted, then back in the cache
                    assert torch.equal(w.state_dict()["w"], sd["w"])
            loads = [j for j in client().status().job_loads if j.job == "evicted-once"]
            assert [j.storage_bytes for j in loads] == [os.path.getsize(path)]
    finally:
        api_close_and_stop(srv)


def test_an_evicted_file_is_read_from_storage_unless_it_changed_there(tmp_path):
    srv = LocalServer(memory_budget="256MiB", storage_roots=[str(tmp_path)],
                      extra_args=["--memory-backing", "4k"]).start()
    try:
        with _knobs.override(socket=srv.socket, job="evicted"):
            sd = {"w": torch.arange(1000, dtype=torch.float32)}
            tce.save(sd, tmp_path / "m.pt", tag="v1")
            weights.publish("v1")
            tce.wait([tmp_path / "m.pt"])
            tce.remove(tmp_path / "m.pt")  # only storage holds it now
            with weights.open() as w:
                assert w._files[str(tmp_path / "m.pt")].buffer_id == 0
                assert torch.equal(w.state_dict()["w"], sd["w"])
            torch.save({"w": torch.zeros(10)}, tmp_path / "m.pt")  # replaced behind its back
            with weights.open() as w, pytest.raises(FailedPreconditionError,
                                                    match="is not the version's file"):
                w.state_dict()
    finally:
        api_close_and_stop(srv)


def test_a_format_added_to_the_table_is_what_the_readers_read(server, tmp_path, monkeypatch):
    """tce.weights reads the formats of tce._weight_formats' table, in its
    order: an entry for raw float32 files, put first, is how a version that
    holds one is read (its file chosen over the torch.save file, read by
    the entry's reader); without it, the torch.save file is the weights."""
    from tce import _service, _weight_formats

    raw = torch.arange(12, dtype=torch.float32)
    tce.save({"w": torch.ones(3)}, tmp_path / "model.pt", tag="v")
    buf = _service.allocate_file(tmp_path / "w.f32", raw.numel() * 4, tag="v")
    buf.tensor.copy_(raw.view(torch.uint8))
    buf.commit()
    weights.publish("v")

    def read_raw(mm, size, path, names):
        name = os.path.basename(path).removesuffix(".f32")
        if names is None or name in names:
            yield name, torch.frombuffer(mm, dtype=torch.float32, count=size // 4)

    with weights.open() as w:
        assert w.paths == [str(tmp_path / "model.pt")] and list(w.state_dict()) == ["w"]
    entry = _weight_formats.WeightFormat(
        "raw-f32", lambda paths: [p for p in paths if p.endswith(".f32")], read=read_raw)
    monkeypatch.setattr(_weight_formats, "FORMATS", [entry, *_weight_formats.FORMATS])
    with weights.open() as w:
        assert w.paths == [str(tmp_path / "w.f32")]
        got = w.state_dict()
    assert list(got) == ["w"] and torch.equal(got["w"], raw)
