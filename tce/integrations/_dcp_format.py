"""The directory format of a DCP checkpoint as TCE writes it: that of DCP's
``FileSystemWriter`` (``__<rank>_<i>.distcp`` data files, a pickled
``.metadata``), with items at aligned offsets."""

from __future__ import annotations

import os

METADATA = ".metadata"
DCP_VERSION = "1.0.0"  # the metadata version FileSystemWriter writes
# Items start at multiples of this in a data file, so a tensor's bytes (64-byte
# aligned within its archive, as torch.save aligns them) are aligned in the
# buffer too and can be viewed as any dtype. The gaps are zeros.
ALIGN = 64


def aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def data_name(rank: int, index: int) -> str:
    return f"__{rank}_{index}.distcp"


def rank_of(name: str) -> int:
    """The rank in a data file's name (``__<rank>_<i>.distcp``)."""
    try:
        return int(name[2:].split("_", 1)[0])
    except ValueError:
        return 0


class CheckpointDir:
    """What the writer and the reader say of their checkpoint: a directory,
    ``self.path``."""

    path: str

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Any path names a checkpoint directory."""
        return isinstance(checkpoint_id, (str, os.PathLike))
