"""Lightning (Trainer and Fabric): ``TCECheckpointIO``, a ``CheckpointIO``
plugin whose saves go through the node's cache.

    trainer = lightning.Trainer(plugins=[TCECheckpointIO()])
    fabric = lightning.Fabric(plugins=[TCECheckpointIO()])

The semantics are those of :func:`tce.patch_torch` for the checkpoint files:
a save returns once the file is in the cache (with ``durable=True``, once it
is on storage), a load reads the cache first, then storage, and a removed
checkpoint is dropped from the cache and from storage.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from tce import api, buffers, client
from tce.errors import NotCachedError

__all__ = ["TCECheckpointIO"]


class TCECheckpointIO(CheckpointIO):
    """Lightning's ``CheckpointIO`` over the node's TCE cache.

    Args:
        job: the cache job (default: the ``job`` setting).
        durable: return from ``save_checkpoint`` only once the file is on
            storage (for tools that read the file right after the save).
    """

    def __init__(self, *, job: str | None = None, durable: bool = False) -> None:
        super().__init__()
        self.job = job
        self.durable = durable
        self.loads_from_cache = 0
        self.loads_from_storage = 0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Save ``checkpoint`` at ``path`` (a ``torch.save`` file) through the
        cache; the parent directory is created as Lightning's own IO does.

        Raises:
            TypeError: ``storage_options`` given (as Lightning's TorchCheckpointIO).
        """
        if storage_options is not None:
            raise TypeError("TCECheckpointIO.save_checkpoint takes no storage_options, got "
                            f"{storage_options!r}")
        path = client.norm(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cached = buffers.save_file(checkpoint, path, job=self.job)
        if self.durable and cached is not None:
            api.wait([path], job=self.job)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint at ``path``, from the cache, else from storage.

        Raises:
            FileNotFoundError: neither the cache nor storage has it.
        """
        path = client.norm(path)
        if map_location is None:
            map_location = _keep  # Lightning's default: storages stay where they were saved
        if not os.path.exists(path) and not api.cached(path, job=self.job):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        obj, from_cache = buffers.load_file(path, map_location, weights_only=weights_only,
                                            job=self.job)
        if from_cache:
            self.loads_from_cache += 1
        else:
            self.loads_from_storage += 1
        return obj

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Drop the checkpoint from the cache (so it is never persisted) and
        from storage."""
        path = client.norm(path)
        try:
            api.remove(path, job=self.job)
        except NotCachedError:
            pass
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)

    def teardown(self) -> None:
        """Nothing to release: the server keeps persisting what was saved."""


def _keep(storage: Any, location: str) -> Any:
    return storage
