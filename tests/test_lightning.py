"""TCECheckpointIO with a real Lightning Trainer (CPU) and a real tce-server."""

from __future__ import annotations

import os

import pytest
import torch

import tce
from tce.core import _knobs
from tce.tools._server import LocalServer

lightning = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from tce.integrations.lightning import TCECheckpointIO  # noqa: E402


class TinyModel(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 4)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(16, 8, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=4)


def _trainer(ckpt_dir: str, io: TCECheckpointIO, epochs: int) -> lightning.Trainer:
    return lightning.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, plugins=[io],
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_top_k=1, every_n_epochs=1)],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )


@pytest.fixture
def storage_server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state")).start()
    s.storage = storage
    with _knobs.override(socket=s.socket, job="lightning"):
        yield s
        tce.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


def test_trainer_saves_through_the_cache_and_resumes_from_it(storage_server):
    ckpt_dir = str(storage_server.storage / "ckpts")
    io = TCECheckpointIO()
    torch.manual_seed(0)
    trainer = _trainer(ckpt_dir, io, epochs=3)
    trainer.fit(TinyModel())
    last = trainer.checkpoint_callback.best_model_path
    assert last.endswith("epoch=2-step=12.ckpt"), last
    assert tce.cached(last)
    # save_top_k=1: the older checkpoints were removed, from the cache and storage.
    tce.wait()
    assert os.listdir(ckpt_dir) == [os.path.basename(last)]
    assert not tce.cached(os.path.join(ckpt_dir, "epoch=1-step=8.ckpt"))
    saved = torch.load(last, weights_only=False)["state_dict"]

    resumed_io = TCECheckpointIO()
    model = TinyModel()
    trainer = _trainer(ckpt_dir, resumed_io, epochs=3)
    trainer.fit(model, ckpt_path=last)  # restores, then has nothing left to train
    assert resumed_io.loads_from_cache == 1 and resumed_io.loads_from_storage == 0
    for k, v in saved.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_durable_save_is_on_storage_when_it_returns(storage_server):
    path = str(storage_server.storage / "d" / "x.ckpt")
    io = TCECheckpointIO(durable=True)
    io.save_checkpoint({"w": torch.arange(4)}, path)
    assert torch.equal(torch.load(path)["w"], torch.arange(4))  # the file itself
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(4))
    assert io.loads_from_cache == 1
    io.remove_checkpoint(path)
    assert not os.path.exists(path) and not tce.cached(path)


def test_bad_input(storage_server):
    io = TCECheckpointIO()
    missing = str(storage_server.storage / "nope.ckpt")
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        io.load_checkpoint(missing)
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({"w": torch.ones(1)}, missing, storage_options={"x": 1})
    assert not os.path.exists(missing) and not tce.cached(missing)
