"""tce.dcp: PyTorch Distributed Checkpoint through a real tce-server, with
real ranks (CPU, gloo, DTensor-sharded state dicts; see dcp_job.py)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import tce
import tce.dcp
from tce import _service
from tce.core import _knobs
from tce.tools._server import LocalServer

from conftest import run_python
from tce.tools._ports import free_port

JOB = os.path.join(os.path.dirname(__file__), "dcp_job.py")


def run_ranks(world: int, action: str, path: str, server: LocalServer, *, job: str = "dcp",
              extra_env: dict[str, str] | None = None, timeout: float = 120) -> list[str]:
    """Run dcp_job.py ACTION PATH as ``world`` ranks; returns each rank's stdout."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TCE_SOCKET=server.socket,
                   TCE_JOB=job, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                   **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, JOB, action, path], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    for rank, (code, out, err) in enumerate(outs):
        if action != "die" or rank == 0:
            assert code == 0, f"rank {rank} exited {code}\n{out}\n{err[-4000:]}\n{server.log()[-2000:]}"
    return [out for _, out, _ in outs]


def sources(outs: list[str]) -> dict[str, int]:
    total: dict[str, int] = {}
    for out in outs:
        line = next(l for l in out.splitlines() if l.startswith("SOURCES "))
        for k, v in json.loads(line[len("SOURCES "):]).items():
            total[k] = total.get(k, 0) + v
    return total


@pytest.fixture
def memory_server(tmp_path):
    """A server with no storage: whatever loads came from its memory."""
    s = LocalServer(memory_budget="512MiB", state_dir=str(tmp_path / "state")).start()
    yield s
    tce.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


@pytest.fixture
def storage_server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="512MiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state")).start()
    s.storage = storage
    yield s
    tce.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


@pytest.mark.slow
def test_save_two_ranks_reshard_from_memory(memory_server, tmp_path):
    """Saved by 2 ranks into a server with no storage; loaded by 2, 1 and 3
    ranks: every tensor equal, every read from this node's cache."""
    ckpt = str(tmp_path / "ckpt" / "step10")
    run_ranks(2, "save", ckpt, memory_server)
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))  # nothing on storage
    for world in (2, 1, 3):
        got = sources(run_ranks(world, "load", ckpt, memory_server))
        assert set(got) == {"local"} and got["local"] > 0, (world, got)


@pytest.mark.slow
def test_fsdp2_model_and_optimizer_reshard_from_memory(memory_server, tmp_path):
    """FSDP2 (CPU, gloo): a model and its AdamW state saved by 2 ranks, loaded
    by 3 and by 1 through get/set_state_dict: the unsharded states equal."""
    ckpt = str(tmp_path / "fsdp")
    run_ranks(2, "fsdp_save", ckpt, memory_server)
    for world in (3, 1):
        got = sources(run_ranks(world, "fsdp_load", ckpt, memory_server))
        assert set(got) == {"local"}, (world, got)


@pytest.mark.slow
def test_persisted_checkpoint_reads_without_tce(storage_server):
    """The persisted directory is an ordinary DCP checkpoint: FileSystemReader
    and dcp_to_torch_save read it in a process that never imports tce."""
    ckpt = str(storage_server.storage / "step20")
    run_ranks(2, "save", ckpt, storage_server, extra_env={"TCE_TEST_DURABLE": "1"})
    assert sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    out = run_python(textwrap.dedent(f"""
        import sys, torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        sys.path.insert(0, {os.path.dirname(JOB)!r})
        from dcp_job import expected
        full = expected()
        sd = {{"model": {{k: torch.zeros_like(v) for k, v in full.items()}},
              "extra": {{"step": 0, "plain": torch.zeros(3, 8)}}}}
        dcp.load(sd, storage_reader=dcp.FileSystemReader({ckpt!r}), no_dist=True)
        for k, v in full.items():
            assert torch.equal(sd["model"][k], v), k
        assert sd["extra"]["step"] == 7 and torch.equal(sd["extra"]["plain"], full["w1"][:3])
        dcp_to_torch_save({ckpt!r}, {ckpt!r} + ".pt")
        flat = torch.load({ckpt!r} + ".pt", weights_only=False)
        for k, v in full.items():
            assert torch.equal(flat["model"][k], v), k
        assert "tce" not in sys.modules
        print("PLAIN OK")
    """), env={"PYTHONWARNINGS": "ignore"})
    assert "PLAIN OK" in out


def _forget(server: LocalServer, ckpt: str, job: str) -> None:
    """Drop the checkpoint's files from the cache (storage keeps them)."""
    with _knobs.override(socket=server.socket, job=job):
        for name in os.listdir(ckpt):
            tce.remove(os.path.join(ckpt, name))
        tce.close()


def _server_storage_reads(server: LocalServer, job: str) -> int:
    """Bytes the server read from storage for `job`'s loads."""
    with _knobs.override(socket=server.socket, job=job):
        st = _service.with_client(lambda c: c.status())
        tce.close()
    return sum(j.storage_bytes for j in st.job_loads if j.job == job)


@pytest.mark.slow
def test_storage_serves_after_the_cache_lost_the_files(storage_server, tmp_path):
    """Files no longer cached are read from storage, and reported so (the
    file both ranks read, by one of them through the server: below)."""
    ckpt = str(storage_server.storage / "step30")
    run_ranks(2, "save", ckpt, storage_server, job="s", extra_env={"TCE_TEST_DURABLE": "1"})
    _forget(storage_server, ckpt, "s")
    got = sources(run_ranks(2, "load", ckpt, storage_server, job="s"))
    assert set(got) <= {"storage", "local"} and got["storage"] > 0, got


@pytest.mark.slow
@pytest.mark.parametrize("cooperative", [True, False], ids=["cooperative", "independent"])
def test_ranks_of_one_node_read_a_file_they_share_from_storage_once(tmp_path, cooperative):
    """Saved by one rank (one data file), loaded by two ranks of one node,
    no ring: both plans read that file. The global plan finds it shared, the
    server reads it from storage once and both ranks read its copy (one
    reports storage, the other its node's cache). With cooperative_restore
    off, each rank reads it itself."""
    storage = tmp_path / "storage"
    storage.mkdir()
    server = LocalServer(memory_budget="512MiB", storage_roots=[str(storage)],
                         state_dir=str(tmp_path / "state"),
                         extra_args=["--cooperative-restore", "true" if cooperative else "false"]).start()
    try:
        ckpt = str(storage / "step40")
        run_ranks(1, "save", ckpt, server, job="shared", extra_env={"TCE_TEST_DURABLE": "1"})
        assert sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp"]
        _forget(server, ckpt, "shared")
        got = sources(run_ranks(2, "load", ckpt, server, job="shared"))
        if not cooperative:
            assert set(got) == {"storage"}, got
            assert _server_storage_reads(server, "shared") == 0
            return
        assert set(got) == {"storage", "local"}, got
        # Each file once: the data file and the metadata both ranks read.
        sizes = sum(os.path.getsize(os.path.join(ckpt, n)) for n in os.listdir(ckpt))
        assert _server_storage_reads(server, "shared") == sizes
    finally:
        tce.close()
        assert server.stop() == 0, server.log()
        server.cleanup()


@pytest.mark.slow
def test_async_save_holds_the_values_as_of_the_call(memory_server, tmp_path):
    """async_save through the writer, the fence, then the model changes: the
    checkpoint holds the values as of the call (dcp_job.py checks them)."""
    run_ranks(2, "async", str(tmp_path / "async"), memory_server)


@pytest.mark.slow
def test_rank_killed_before_commit_leaves_no_checkpoint(memory_server, tmp_path):
    """A checkpoint saved again into its directory, and rank 1 dies before
    committing its data file: the save fails on rank 0, no .metadata exists
    (not even the first save's, which no longer matches the data files),
    and a load refuses the directory."""
    ckpt = str(tmp_path / "dead")
    outs = run_ranks(2, "die", ckpt, memory_server, timeout=90)
    assert "RAISED" in outs[0], outs[0]
    with _knobs.override(socket=memory_server.socket, job="dcp"):
        assert not tce.cached(os.path.join(ckpt, ".metadata"))
        with pytest.raises(CheckpointException, match="no complete DCP checkpoint"):
            dcp.load({"x": torch.zeros(1)}, storage_reader=tce.dcp.StorageReader(ckpt),
                     no_dist=True)


def test_directory_without_metadata_is_refused(server, tmp_path):
    """A reader pointed at a directory with no .metadata says so."""
    (tmp_path / "__0_0.distcp").write_bytes(b"\0" * 64)
    with pytest.raises(CheckpointException, match=r"no complete DCP checkpoint in .*\.metadata is neither"):
        dcp.load({"x": torch.zeros(1)}, storage_reader=tce.dcp.StorageReader(tmp_path), no_dist=True)


def test_metadata_that_is_not_dcp_metadata_is_refused(server, tmp_path):
    """A truncated or foreign .metadata is refused with the reason."""
    meta = tmp_path / ".metadata"
    for content, reason in ((b"", "not a DCP checkpoint's metadata: it ends before its pickle does"),
                            (pickle.dumps({"a": 1}), "holds a dict")):
        meta.write_bytes(content)
        with pytest.raises(CheckpointException, match=reason):
            dcp.load({"x": torch.zeros(1)}, storage_reader=tce.dcp.StorageReader(tmp_path),
                     no_dist=True)


def test_single_process_roundtrip_and_ranged_reads(server, tmp_path):
    """One process, no process group: values equal, every read local, and
    each read covers only its item's range."""
    sd = {"a": torch.randn(64, 16), "b": {"c": torch.arange(7)}, "n": "text", "t": torch.ones(3)[1:]}
    dcp.save(sd, storage_writer=tce.dcp.StorageWriter(tmp_path / "one"), no_dist=True)
    out = {"a": torch.zeros(64, 16), "b": {"c": torch.zeros(7, dtype=torch.long)}, "n": "",
           "t": torch.zeros(2)}
    reader = tce.dcp.StorageReader(tmp_path / "one")
    dcp.load(out, storage_reader=reader, no_dist=True)
    assert torch.equal(out["a"], sd["a"]) and torch.equal(out["b"]["c"], sd["b"]["c"])
    assert out["n"] == "text" and torch.equal(out["t"], torch.ones(2))
    assert reader.sources() == {"local": 4}
    # The coordinator recorded the checkpoint as a complete tag, with every file.
    job = _knobs.get("job")
    tag = next(t for t in _service.with_client(lambda c: c.list_tags(job)) if t.tag == "one")
    assert sorted(os.path.basename(f.path) for f in tag.files) == [".metadata", "__0_0.distcp"]
    for f in tag.files:
        assert f.size == _service.with_client(lambda c: c.lookup(job, f.path)).size
    ranges = sorted((r.offset, r.offset + r.length) for r in reader.reads)
    assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:]))  # item by item


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_staging_gpu_tensors_copies_them_straight_into_the_cache(server, tmp_path):
    """The writer's stager with GPU tensors (what dcp.async_save calls): it
    returns before any device-to-host copy, which runs on the staging thread
    straight into the cache buffer; after the fence the tensors change, and
    the checkpoint holds the values as of the call, saved as CPU storages."""
    sd = {"w": torch.randn(1024, 1024, device="cuda"),
          "v": torch.arange(10, device="cuda")[2:],  # a view: saved as its own elements
          "b": torch.randn(3, device="cuda", dtype=torch.bfloat16), "n": 5}
    want = {k: (v.cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}
    path = tmp_path / "gpu"
    writer = tce.dcp.StorageWriter(path)
    staged = writer.stage(sd)
    assert all(v.device.type == "cpu" for v in staged.values() if isinstance(v, torch.Tensor))
    tce.wait_staged()  # the fence
    for k in ("w", "v", "b"):
        sd[k].add_(100)
    dcp.save(staged, storage_writer=writer, no_dist=True)
    out = {"w": torch.zeros(1024, 1024), "v": torch.zeros(8, dtype=torch.long),
           "b": torch.zeros(3, dtype=torch.bfloat16), "n": 0}
    dcp.load(out, storage_reader=tce.dcp.StorageReader(path), no_dist=True)
    for k in ("w", "v", "b"):
        assert torch.equal(out[k], want[k]), k
    assert out["n"] == 5
    job = _knobs.get("job")
    _, mm = _service.with_client(lambda c: c.open(job, str(path / "__0_0.distcp")))
    assert b"X\x06\x00\x00\x00cuda:" not in bytes(mm[:])  # every archive names a CPU storage, as DCP's do
    mm.close()


def _archive(t: torch.Tensor) -> bytes:
    import io
    b = io.BytesIO()
    torch.save(t, b)
    return b.getvalue()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_planned_region_is_copied_from_the_file_into_the_destination(tmp_path, dtype):
    """An item's region (DCP's storage_offsets/lengths) lands in the
    destination bytewise equal to torch.load + narrow: regions contiguous in
    the file go straight into the destination, others through the scratch
    buffer; saved views (storage offset, strides) and 0-d tensors too."""
    from tce.integrations._dcp_item import FdSource, Reads, Scratch, read_tensor, tensor_layout

    base = (torch.arange(6 * 10 * 4) * 7 - 3).to(dtype).reshape(6, 10, 4)
    cases = [  # (saved tensor, offsets, lengths, expected copy)
        (base, [2, 0, 0], [3, 10, 4], "direct"),     # rows: contiguous
        (base, [0, 0, 0], [6, 10, 4], "direct"),     # whole
        (base, [1, 3, 0], [1, 5, 4], "direct"),      # one row's middle
        (base, [0, 2, 0], [6, 5, 4], "scratch"),     # a column band
        (base, [1, 1, 1], [4, 8, 2], "scratch"),
        (base[2:5], [0, 0, 0], [3, 10, 4], "direct"),  # a view: storage offset
        (base.transpose(0, 1), [0, 0, 0], [10, 6, 4], "scratch"),  # strides
        (base[1, 2, 3], [], [], "direct"),           # 0-d
    ]
    data = tmp_path / "items"
    offsets = []
    with open(data, "wb") as f:
        for t, _, _, _ in cases:
            f.write(b"\0" * (-f.tell() % 64))
            offsets.append(f.tell())
            f.write(_archive(t))
    size = data.stat().st_size
    fd = os.open(data, os.O_RDONLY)
    try:
        source, scratch = FdSource(fd, size), Scratch()
        for (t, offs, lens, how), at in zip(cases, offsets):
            length = len(_archive(t))
            layout = tensor_layout(source, at, length)
            assert layout is not None and layout.size == tuple(t.size())
            want = t
            for dim, (o, n) in enumerate(zip(offs, lens)):
                want = want.narrow(dim, o, n)
            target = torch.full(tuple(lens), 99, dtype=dtype)
            reads = Reads()
            assert read_tensor(source, layout, offs, lens, target, scratch, reads) == how
            reads.run()
            assert (target.contiguous().reshape(-1).view(torch.uint8).tolist()
                    == want.contiguous().reshape(-1).view(torch.uint8).tolist()), (offs, lens)
    finally:
        os.close(fd)


def test_reader_copies_each_tensor_once_from_cache_and_storage(storage_server):
    """Through dcp.load: a checkpoint written through the cache and one written
    by FileSystemWriter (read from storage) load bytewise equal, every tensor
    copied straight from the file into its destination; destinations that
    are not contiguous or of another dtype go through the scratch buffer."""
    sd = {"a": torch.randn(512, 300), "h": torch.randn(64, 33).to(torch.bfloat16),
          "b": {"c": torch.arange(1000)}, "n": "text"}
    with _knobs.override(socket=storage_server.socket, job="direct"):
        dcp.save(sd, storage_writer=tce.dcp.StorageWriter(storage_server.storage / "tce"), no_dist=True)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(storage_server.storage / "fs"), no_dist=True)
        for where, source in (("tce", "local"), ("fs", "storage")):
            out = {"a": torch.zeros(512, 300), "h": torch.zeros(64, 33, dtype=torch.bfloat16),
                   "b": {"c": torch.zeros(1000, dtype=torch.long)}, "n": ""}
            reader = tce.dcp.StorageReader(storage_server.storage / where)
            dcp.load(out, storage_reader=reader, no_dist=True)
            assert reader.sources() == {source: 4}
            assert dict(reader.copies) == {"direct": 3}
            for k in ("a", "h"):
                assert torch.equal(out[k].view(torch.uint8), sd[k].view(torch.uint8)), (where, k)
            assert torch.equal(out["b"]["c"], sd["b"]["c"]) and out["n"] == "text"
        # Neither load read through the ring: the session took no range buffer.
        assert _service.with_client(lambda c: c._range_buffer) is None
        # A transposed destination (not contiguous) and one of another dtype.
        out = {"a": torch.zeros(300, 512).t(), "h": torch.zeros(64, 33),
               "b": {"c": torch.zeros(1000, dtype=torch.long)}, "n": ""}
        reader = tce.dcp.StorageReader(storage_server.storage / "tce")
        dcp.load(out, storage_reader=reader, no_dist=True)
        assert dict(reader.copies) == {"direct": 1, "scratch": 2}
        assert torch.equal(out["a"], sd["a"]) and torch.equal(out["h"], sd["h"].float())
        tce.close()
