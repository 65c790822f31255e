"""tce.weights on DCP versions, and a slice of each tensor (docs/weights.md).

A real server; checkpoints saved with dcp.save through tce.dcp.StorageWriter
(which publishes the version), by one process and by two ranks (gloo,
DTensor-sharded: tests/dcp_job.py, run as tests/test_dcp.py runs it).
"""

from __future__ import annotations

import mmap
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import tce
import tce.dcp
from tce import weights
from tce.core import _knobs
from tce.errors import CorruptCheckpointError, InvalidArgumentError, NotCachedError
from tce.tools._server import LocalServer

from dcp_job import expected
from test_dcp import run_ranks


@pytest.fixture(autouse=True)
def own_job(request):
    """A job of its own per test: versions count from 1."""
    if "server" in request.fixturenames:
        request.getfixturevalue("server")  # (its own job setting comes first)
    with _knobs.override(job=f"wd-{os.getpid()}-{request.node.name}"[:200]):
        yield


@pytest.fixture
def storage_server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state"), extra_args=["--memory-backing", "4k"]).start()
    s.storage = storage
    with _knobs.override(socket=s.socket):
        yield s
        tce.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _state() -> dict:
    """A model's weights at the top level (as torchtitan saves them), its
    optimizer's state and a few entries that are no weights."""
    g = torch.Generator().manual_seed(3)
    model = _model().state_dict()
    return {**model,
            "emb": torch.randn(10, 6, 4, generator=g).to(torch.bfloat16),
            "scale": torch.tensor(2.5),
            "optimizer": {"exp_avg": {n: torch.randn(t.shape, generator=g) for n, t in model.items()}},
            "step": 7, "note": "text"}


def _weights_of(sd: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors view the same memory (one file's mapping)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _save(sd: dict, path) -> None:
    dcp.save(sd, storage_writer=tce.dcp.StorageWriter(path), no_dist=True)


def test_a_dcp_version_reads_back_bitwise_viewing_the_cache(server, tmp_path):
    sd = _state()
    _save(sd, tmp_path / "step7")  # the writer publishes the version itself
    want = _weights_of(sd)
    with weights.open() as w:
        assert (w.version, w.info.tag) == (1, "step7")
        assert w.paths == [str(tmp_path / "step7" / ".metadata"),
                           str(tmp_path / "step7" / "__0_0.distcp")]
        got = w.state_dict()
    assert list(got) == list(want)  # no optimizer state, no bytes entries; the metadata's order
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    # One saved chunk each: every tensor views the one mapping of the data file.
    first = got["0.weight"]
    assert all(_shares(first, t) for t in got.values())


def test_load_into_a_module_from_a_dcp_version(server, tmp_path):
    trained = _model()
    for p in trained.parameters():
        p.data.mul_(3)
    _save({**trained.state_dict(), "optim": {"lr": torch.tensor(0.1)}}, tmp_path / "v")
    fresh = _model()
    with weights.open() as w:
        assert sorted(w.load_into(fresh)) == sorted(trained.state_dict())
    for (n, a), (_, b) in zip(trained.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n


def test_entries_choose_which_tensors_are_weights(server, tmp_path):
    sd = _state()
    _save(sd, tmp_path / "s")
    assert weights.weight_entries(["a.w", "optim.state.x", "optimizer.m", "optimizer_0.v",
                                   "model.optim_head"]) == ["a.w", "model.optim_head"]
    with weights.open(entries=lambda fqn: fqn.startswith("optimizer.")) as w:
        got = w.state_dict()
    assert list(got) == [f"optimizer.exp_avg.{n}" for n in sd["optimizer"]["exp_avg"]]
    for n, t in sd["optimizer"]["exp_avg"].items():
        assert torch.equal(got[f"optimizer.exp_avg.{n}"], t), n


def test_names_filter_the_tensors(server, tmp_path):
    sd = _state()
    _save(sd, tmp_path / "s")
    with weights.open() as w:
        got = w.state_dict(["2.bias", "emb", "no.such", "optimizer.exp_avg.0.bias"])
    assert list(got) == ["2.bias", "emb"]
    assert torch.equal(got["2.bias"], sd["2.bias"]) and torch.equal(got["emb"], sd["emb"])


def _slices(name: str, shape: torch.Size) -> list[tuple]:
    """Regions of a tensor to ask for: equal parts along each dimension,
    and a few odd ones."""
    out = [()] if not shape else []
    for dim, n in enumerate(shape):
        for count in (c for c in (1, 2, n) if c and n % c == 0):
            out += [weights.part(shape, dim, i, count) for i in range(count)]
        out.append(tuple((1, max(0, m - 2)) if d == dim else (0, m) for d, m in enumerate(shape)))
    out.append(tuple((0, 0) for _ in shape))  # empty (but for a 0-d tensor: all of it)
    return out


def _want(full: torch.Tensor, region: tuple) -> torch.Tensor:
    return full[tuple(slice(o, o + n) for o, n in region)]


def test_a_slice_of_each_tensor_is_exactly_that_slice(server, tmp_path):
    sd = _state()
    _save(sd, tmp_path / "s")
    want = _weights_of(sd)
    with weights.open() as w:
        anchor = w.state_dict(["0.weight"])["0.weight"]
        for name, full in want.items():
            for region in _slices(name, full.shape):
                got = w.state_dict([name], shard=lambda n, shape: region)[name]
                expect = _want(full, region)
                assert got.dtype == full.dtype and got.shape == expect.shape, (name, region)
                assert torch.equal(got, expect), (name, region)
                if got.numel():  # inside one saved tensor: a view, nothing copied
                    assert _shares(got, anchor), (name, region)


def test_shard_is_called_per_tensor_with_its_global_shape(server, tmp_path):
    sd = _state()
    _save(sd, tmp_path / "s")
    seen = {}

    def shard(name, shape):
        seen[name] = shape
        return weights.part(shape, -1, 1, 2) if name.endswith("weight") else None

    with weights.open() as w:
        got = w.state_dict(shard=shard)
    assert seen == {n: t.shape for n, t in _weights_of(sd).items()}
    assert torch.equal(got["0.weight"], sd["0.weight"][:, 8:])
    assert not got["0.weight"].is_contiguous()  # a strided view of the mapping
    assert torch.equal(got["0.bias"], sd["0.bias"]) and torch.equal(got["emb"], sd["emb"])


def test_a_shard_outside_the_tensor_is_refused(server, tmp_path):
    _save({"w": torch.zeros(6, 4)}, tmp_path / "s")
    with weights.open() as w:
        for bad in (((0, 7), (0, 4)), ((0, 6),), ((-1, 2), (0, 4)), ((0, 6), (0, 4), (0, 1)),
                    ((0.5, 1), (0, 4)), "rows"):
            with pytest.raises(InvalidArgumentError,
                               match=r"shard\('w', \(6, 4\)\) gave .*: not an \(offset, length\) pair"):
                w.state_dict(shard=lambda n, s: bad)
    with pytest.raises(InvalidArgumentError, match=r"part 0 of 4 equal parts of dimension 0 of shape \(6, 4\)"):
        weights.part((6, 4), 0, 0, 4)
    with pytest.raises(InvalidArgumentError, match=r"part: dimension 2 of a tensor of shape \(6, 4\)"):
        weights.part((6, 4), 2, 0, 1)
    with pytest.raises(InvalidArgumentError, match="part 2 of 2"):
        weights.part((6, 4), 0, 2, 2)


def test_a_torch_save_version_takes_the_same_shard(server, tmp_path):
    sd = _model().state_dict()
    tce.save(sd, tmp_path / "model.pt", tag="v")
    weights.publish("v")
    with weights.open() as w:
        assert w.paths == [str(tmp_path / "model.pt")]
        full = w.state_dict()
        half = w.state_dict(shard=lambda n, s: weights.part(s, 0, 1, 2))
    assert all(torch.equal(full[n], t) for n, t in sd.items())
    for n, t in sd.items():
        assert torch.equal(half[n], t[t.shape[0] // 2:]), n
        assert _shares(half[n], full[n])  # narrowed views of the same mapping


def test_files_no_longer_cached_are_read_from_storage(storage_server):
    sd = _state()
    path = storage_server.storage / "step9"
    writer = tce.dcp.StorageWriter(path)
    dcp.save(sd, storage_writer=writer, no_dist=True)
    writer.wait(timeout=120)
    for name in os.listdir(path):
        tce.remove(path / name)
    want = _weights_of(sd)
    with weights.open() as w:
        got = w.state_dict()
        rows = w.state_dict(["emb"], shard=lambda n, s: weights.part(s, 2, 1, 2))["emb"]
    assert list(got) == list(want)
    assert all(torch.equal(got[n], t) for n, t in want.items())
    assert torch.equal(rows, sd["emb"][:, :, 2:])
    # Gone from storage too: the reader says which file and why.
    os.remove(path / "__0_0.distcp")
    with weights.open() as w, pytest.raises(NotCachedError,
                                            match=r"__0_0.distcp is neither in this node's cache nor on storage"):
        w.state_dict()


@pytest.mark.slow
def test_two_ranks_chunks_are_assembled_and_sliced(server, tmp_path):
    """Saved by 2 ranks (gloo, DTensor: w1 and half row-sharded, w2
    column-sharded, bias replicated): whole tensors are assembled from both
    ranks' files, a slice inside one rank's chunk is a view of its file, a
    slice across both is assembled, every one exactly full[slice]."""
    job = _knobs.get("job")
    ckpt = str(tmp_path / "ckpt" / "step10")
    run_ranks(2, "save", ckpt, server, job=job)
    full = expected()
    full = {f"model.{n}": t for n, t in full.items()} | {"extra.plain": full["w1"][:3]}
    with weights.open() as w:
        assert sorted(os.path.basename(p) for p in w.paths) == [".metadata", "__0_0.distcp",
                                                                 "__1_0.distcp"]
        got = w.state_dict()
        assert sorted(got) == sorted(full)  # extra.step is bytes: no weight
        for name, t in full.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        # w1 (24, 8): rank 0 saved rows 0-11, rank 1 rows 12-23.
        r0 = w.state_dict(["model.w1"], shard=lambda n, s: weights.part(s, 0, 0, 2))["model.w1"]
        r1 = w.state_dict(["model.w1"], shard=lambda n, s: weights.part(s, 0, 3, 4))["model.w1"]
        across = w.state_dict(["model.w1"], shard=lambda n, s: ((10, 4), (2, 5)))["model.w1"]
        assert torch.equal(r0, full["model.w1"][:12]) and torch.equal(r1, full["model.w1"][18:])
        assert torch.equal(across, full["model.w1"][10:14, 2:7])
        bias = got["model.bias"]  # replicated: saved once, a view
        assert _shares(r0, bias) != _shares(r1, bias)  # one per rank's file
        assert not _shares(across, r0) and not _shares(across, r1)  # a new tensor
        # w2 (30, 6): rank 0 saved columns 0-2, rank 1 columns 3-5.
        for i in range(2):
            cols = w.state_dict(["model.w2"], shard=lambda n, s: weights.part(s, 1, i, 2))["model.w2"]
            assert torch.equal(cols, full["model.w2"][:, 3 * i:3 * i + 3])
        for i in range(3):
            rows = w.state_dict(["model.w2"], shard=lambda n, s: weights.part(s, 0, i, 3))["model.w2"]
            assert torch.equal(rows, full["model.w2"][10 * i:10 * i + 10]), i
        for name, t in full.items():
            for region in _slices(name, t.shape):
                got = w.state_dict([name], shard=lambda n, s: region)[name]
                assert torch.equal(got, _want(t, region)), (name, region)


def _mapped(path: str) -> torch.Tensor:
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mm, dtype=torch.uint8)


def test_a_chunk_not_aligned_in_its_file_is_read_not_viewed(tmp_path):
    """DCP's own FileSystemWriter packs items without alignment: a tensor
    after items of odd length is not aligned for its dtype in the file, so
    it is read (a copy, aligned); aligned, it is a view; equal either way."""
    from tce.integrations._dcp_weights import DcpWeights

    viewed = set()
    for pad in range(4):
        d = tmp_path / str(pad)
        # Each non-tensor item is an archive of an odd number of bytes: the
        # tensors after `pad` of them start at another offset modulo 4.
        sd = {**{f"s{i}": "x" for i in range(pad)},
              "a": torch.randn(5, 7), "b": torch.arange(12, dtype=torch.int64)}
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
        files: dict[str, torch.Tensor] = {}
        ckpt = DcpWeights(str(d), lambda p: files.setdefault(p, _mapped(p)), list)
        assert ckpt.names == ["a", "b"]
        for name in ("a", "b"):
            got = ckpt.read(name)
            data = files[str(d / "__0_0.distcp")]
            assert torch.equal(got, sd[name]), (pad, name)
            region = ((1, 2),) + ((0, 7),) * (got.dim() - 1)
            assert torch.equal(ckpt.read(name, region), sd[name][1:3]), (pad, name)
            viewed.add(_shares(got, data))
            assert got.data_ptr() % got.element_size() == 0
    assert viewed == {True, False}


def test_a_chunk_the_metadata_misdescribes_is_refused(tmp_path):
    from tce.integrations._dcp_weights import DcpWeights

    dcp.save({"w": torch.zeros(6, 4)}, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True)
    ckpt = DcpWeights(str(tmp_path), _mapped, list)
    ckpt.read("w")
    ckpt._tensors["w"].properties.dtype = torch.float64  # what a hostile .metadata could say
    with pytest.raises(CorruptCheckpointError,
                       match=r"__0_0.distcp: item w is a torch.float32 tensor of size \(6, 4\); "
                             r"the metadata says torch.float64, size \(6, 4\)"):
        ckpt.read("w")
