"""Asynchronous saves and the GPU path (the GPU tests need CUDA: marked gpu)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs, _staging
from tce.tools._server import LocalServer
from tce.errors import ServerUnavailableError
from fake_device import FakeDevice
from helpers import assert_same, until

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _model(width: int = 1024, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 8)).to(device)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, device: str = "cpu") -> None:
    x = torch.randn(4, model[0].in_features, device=device)
    model(x).square().mean().backward()
    opt.step()


def _fenced_save_holds_the_old_values(tmp_path, device: str) -> None:
    model = _model(device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    seen_at_step = []

    def after_fence(optimizer, args, kwargs):  # registered after TCE's fence: runs after it
        seen_at_step.append((_staging.pending(), staged.done()))

    staged = tce.save(model.state_dict(), tmp_path / "m.pt", blocking=False)
    assert isinstance(staged, _staging.StagedSave) and staged.size > 0
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    hook = register_optimizer_step_pre_hook(after_fence)
    try:
        _step(model, opt, device)  # mutates every parameter in place
    finally:
        hook.remove()
    assert seen_at_step == [(0, True)]  # the fence waited for the copies and the commit
    after = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step did change them
    out = tce.load(tmp_path / "m.pt", weights_only=True)
    for k in before:
        assert_same(out[k].cpu(), before[k])


def test_an_async_save_is_fenced_by_the_optimizer_step(server, tmp_path):
    _fenced_save_holds_the_old_values(tmp_path, "cpu")


def test_wait_staged_returns_the_commit_and_tce_wait_waits_for_staging(server, tmp_path):
    sd = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3)}
    staged = tce.save(sd, tmp_path / "x.pt", blocking=False, tag="t1")
    info = staged.wait(timeout=60)
    assert info.path == str(tmp_path / "x.pt") and info.size == staged.size
    assert _staging.pending() == 1  # not yet through the fence
    tce.wait_staged()
    assert _staging.pending() == 0
    staged = tce.save(sd, tmp_path / "y.pt", blocking=False)
    tce.wait([])  # waits for staging first, even with nothing to persist
    assert staged.done() and tce.cached(tmp_path / "y.pt")
    assert_same(tce.load(tmp_path / "y.pt", weights_only=True)["a"], sd["a"])


def test_a_staging_failure_is_raised_by_the_fence(tmp_path, monkeypatch):
    s = LocalServer(memory_budget="64MiB").start()
    with _knobs.override(socket=s.socket, on_unavailable="raise"):
        real = _staging.Staging.finish

        def finish_after_the_server_died(self):
            s.kill()
            real(self)

        monkeypatch.setattr(_staging.Staging, "finish", finish_after_the_server_died)
        staged = tce.save({"w": torch.ones(100)}, tmp_path / "lost.pt", blocking=False)
        with pytest.raises(ServerUnavailableError):
            tce.wait_staged(timeout=60)
        assert staged.done()
        tce.wait_staged()  # each failure is raised once
        api.close()
    s.cleanup()


def test_the_engine_switch_is_checked():
    with pytest.raises(ValueError, match="must be true or false"):
        _knobs.configure(**{"async": "maybe"})


# ---- the GPU path on a fake device (host memory, streams run by threads) ----


@pytest.fixture
def fake(monkeypatch):
    device = FakeDevice()
    monkeypatch.setattr(_staging, "cuda", device)
    yield device
    device.staging.release()  # a failed test may have left it held
    tce.wait_staged(timeout=60)
    device.close()


def _mixed(fake: FakeDevice) -> dict:
    torch.manual_seed(1)
    return {
        "big": fake.tensor(torch.randn(1 << 20).to(torch.bfloat16)),  # 2 MiB: copied alone
        "small": [fake.tensor(torch.randn(7)) for _ in range(50)],  # coalesced
        "cpu": torch.arange(1000),
        "int": fake.tensor(torch.randint(0, 100, (3, 5), dtype=torch.int32)),
        "view": fake.tensor(torch.randn(1 << 19))[10:20],  # its whole 2 MiB storage is saved
    }


@pytest.mark.parametrize("blocking", [True, False])
def test_fake_device_mixed_state_dict_is_saved_bitwise(server, tmp_path, fake, blocking):
    sd = _mixed(fake)
    r = tce.save(sd, tmp_path / "m.pt", blocking=blocking)
    if not blocking:
        r.wait(60)
    assert fake.copies == 2 + 1 and fake.gathered == [51]  # big, view; then the 51 small in one
    out = tce.load(tmp_path / "m.pt", weights_only=True)
    assert_same(out["big"], sd["big"])
    assert all(torch.equal(a, b) for a, b in zip(out["small"], sd["small"]))
    assert_same(out["cpu"], sd["cpu"])
    assert_same(out["int"], sd["int"])
    assert_same(out["view"], sd["view"])


def test_fake_device_async_save_returns_before_registering_or_copying(server, tmp_path, fake):
    sd = _mixed(fake)
    fake.staging.hold()  # the device copies cannot run
    staged = tce.save(sd, tmp_path / "a.pt", blocking=False)
    assert not staged.done()
    until(lambda: fake.registrations, timeout=30)
    [(_, thread)] = fake.registrations
    assert thread.startswith("tce-staging")  # never the caller, which registering stalls for seconds
    # The staging thread has queued every copy (big, view; the small in one
    # gather): none has run, so nothing can be done or cached yet.
    until(lambda: fake.copies == 2 + 1 and fake.gathered == [51], timeout=30, what="the copies to be queued")
    assert fake.copied == 0
    assert not staged.done() and not tce.cached(tmp_path / "a.pt")
    fake.staging.release()
    tce.wait_staged(timeout=60)
    assert staged.done() and tce.cached(tmp_path / "a.pt")
    assert_same(tce.load(tmp_path / "a.pt", weights_only=True)["big"], sd["big"])


def test_fake_device_copies_see_work_queued_before_the_save(server, tmp_path, fake):
    t = fake.tensor(torch.zeros(1 << 20))
    fake.current.submit(lambda: (time.sleep(0.3), t.fill_(3.0)))  # a slow kernel, then a write
    for blocking in (True, False):
        staged = tce.save({"t": t}, tmp_path / f"q{blocking}.pt", blocking=blocking)
        if not blocking:
            staged.wait(60)
        assert bool((tce.load(tmp_path / f"q{blocking}.pt", weights_only=True)["t"] == 3.0).all())


def test_fake_device_async_save_is_fenced_by_the_optimizer_step(server, tmp_path, fake):
    """The copies run only after a delay, reading the parameters as they are
    then: the checkpoint holds the old values only if the step waited."""
    model = _model()
    for p in model.parameters():
        fake.tensor(p.data)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fake.staging.hold()
    staged = tce.save(model.state_dict(), tmp_path / "m.pt", blocking=False)
    threading.Timer(0.3, fake.staging.release).start()
    _step(model, opt)
    assert staged.done()
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    out = tce.load(tmp_path / "m.pt", weights_only=True)
    for k in before:
        assert_same(out[k], before[k])


@pytest.mark.parametrize("blocking", [True, False])
def test_fake_device_copy_failure_is_raised_and_nothing_is_cached(server, tmp_path, fake, blocking):
    fake.fail_copies = RuntimeError("fake: device-to-host copy failed")
    p = tmp_path / "f.pt"
    with pytest.raises(RuntimeError, match="device-to-host copy failed"):
        r = tce.save(_mixed(fake), p, blocking=blocking)
        tce.wait_staged(timeout=60)
    if not blocking:
        assert r.done()
    assert not tce.cached(p)
    assert int(tce.status()["pending_bytes"]) == 0  # the allocation was aborted
    tce.save({"x": torch.ones(3)}, p)  # the server and the session carry on
    assert_same(tce.load(p, weights_only=True)["x"], torch.ones(3))


def test_fake_device_a_failed_staging_leaves_no_copy_running(server, tmp_path, fake):
    """The large copies are enqueued, then staging fails: the buffer goes back
    to the server only after those copies ran, never with DMA still writing."""
    fake.fail_pinned = RuntimeError("fake: out of pinned memory")
    fake.staging.hold()
    staged = tce.save(_mixed(fake), tmp_path / "p.pt", blocking=False)
    threading.Timer(0.5, fake.staging.release).start()
    with pytest.raises(RuntimeError, match="out of pinned memory"):
        tce.wait_staged(timeout=60)
    assert staged.done() and fake.copies == 2 and fake.copied == 2
    assert not tce.cached(tmp_path / "p.pt") and int(tce.status()["pending_bytes"]) == 0


def test_fake_device_registers_each_buffer_once(server, tmp_path, fake):
    sd = {"w": fake.tensor(torch.randn(1 << 20))}
    p = tmp_path / "r.pt"
    for _ in range(8):  # the path's versions alternate between a few buffers
        tce.save(sd, p)
    ids = [b for b, _ in fake.registrations]
    assert 1 <= len(ids) <= 3 and len(set(ids)) == len(ids), fake.registrations
    assert fake.copies == 8
    assert_same(tce.load(p, weights_only=True)["w"], sd["w"])


# ---- GPU ------------------------------------------------------------------


@pytest.mark.gpu
@cuda
def test_gpu_save_load_mixed_devices_bitwise(server, tmp_path):
    sd = {
        "big": torch.randn(4 << 20, device="cuda").to(torch.bfloat16),
        "small": [torch.randn(7, device="cuda") for _ in range(50)],  # coalesced
        "cpu": torch.arange(1000),
        "int": torch.randint(0, 100, (3, 5), device="cuda", dtype=torch.int32),
        "view": torch.randn(1 << 20, device="cuda")[10:20],  # a view: its whole storage is saved
    }
    for blocking in (True, False):
        p = tmp_path / f"g{blocking}.pt"
        r = tce.save(sd, p, blocking=blocking)
        if not blocking:
            r.wait(60)
        on_gpu = tce.load(p, map_location="cuda", weights_only=True)  # from the registered mapping
        as_saved = tce.load(p, weights_only=True)  # devices as saved
        plain = torch.load(p, weights_only=True) if p.exists() else None
        assert plain is None  # nothing persisted (no storage roots): the cache served
        for out in (on_gpu, as_saved):
            assert out["big"].is_cuda and out["big"].dtype == torch.bfloat16
            assert torch.equal(out["big"].cpu(), sd["big"].cpu())
            assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(out["small"], sd["small"]))
            assert torch.equal(out["int"].cpu(), sd["int"].cpu())
            assert torch.equal(out["view"].cpu(), sd["view"].cpu())
        assert torch.equal(as_saved["cpu"], sd["cpu"]) and not as_saved["cpu"].is_cuda


@pytest.mark.gpu
@cuda
def test_gpu_async_save_is_fenced(server, tmp_path):
    _fenced_save_holds_the_old_values(tmp_path, "cuda")


@pytest.mark.gpu
@cuda
def test_gpu_copy_sees_work_queued_before_the_save(server, tmp_path):
    """The staging stream waits for the current stream: a value written by a
    kernel queued just before the save is the value saved."""
    t = torch.zeros(64 << 20, device="cuda")
    torch.cuda._sleep(50_000_000)  # keeps the current stream busy (~tens of ms)
    t.fill_(3.0)
    staged = tce.save({"t": t}, tmp_path / "q.pt", blocking=False)
    tce.wait_staged()
    assert staged.done()
    assert bool((tce.load(tmp_path / "q.pt", weights_only=True)["t"] == 3.0).all())


@pytest.mark.gpu
@cuda
def test_gpu_save_registers_each_buffer_once(server, tmp_path):
    sd = {"w": torch.randn(8 << 20, device="cuda")}
    p = tmp_path / "r.pt"
    fresh = []
    real = _staging.register

    def counting(mapping):
        fresh.append(not mapping.cuda_registered)
        real(mapping)

    _staging.register = counting
    try:
        for _ in range(8):  # the path's versions alternate between a few buffers
            tce.save(sd, p)
    finally:
        _staging.register = real
    assert len(fresh) == 8 and 1 <= sum(fresh) <= 3, fresh  # registered once per buffer, not per save
    assert torch.equal(tce.load(p, weights_only=True)["w"].cpu(), sd["w"].cpu())


@pytest.mark.gpu
@cuda
def test_gpu_async_save_registers_on_the_staging_thread(server, tmp_path):
    sd = {"w": torch.randn((9 << 20) + 4099, device="cuda"),  # a size no other test saves: a new buffer
          "b": torch.randn(10, device="cuda")}
    threads = []
    real = _staging.register

    def recording(mapping):
        if not mapping.cuda_registered:
            threads.append(threading.current_thread().name)
        real(mapping)

    _staging.register = recording
    try:
        staged = tce.save(sd, tmp_path / "t.pt", blocking=False)
        staged.wait(60)
        tce.wait_staged()
    finally:
        _staging.register = real
    assert len(threads) == 1 and threads[0].startswith("tce-staging"), threads
    out = tce.load(tmp_path / "t.pt", weights_only=True)
    assert torch.equal(out["w"].cpu(), sd["w"].cpu()) and torch.equal(out["b"].cpu(), sd["b"].cpu())

