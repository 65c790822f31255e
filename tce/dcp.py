"""``tce.dcp``: PyTorch Distributed Checkpoint through the cache
(:class:`StorageWriter`, :class:`StorageReader`; see
:mod:`tce.integrations.dcp`)."""

from tce.integrations.dcp import METADATA, ReadRecord, StorageReader, StorageWriter

__all__ = ["METADATA", "ReadRecord", "StorageReader", "StorageWriter"]
