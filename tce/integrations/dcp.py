"""PyTorch Distributed Checkpoint (DCP) through the node's cache.

:class:`StorageWriter` and :class:`StorageReader` implement DCP's storage
contracts (``torch.distributed.checkpoint.StorageWriter`` / ``StorageReader``)
over a TCE cache server, in the directory format of DCP's own
``FileSystemWriter``: one data file per rank (``__<rank>_0.distcp``, each
item a ``torch.save`` archive or raw bytes at an offset) and a pickled
``.metadata`` that maps every item to its file, offset and length. So a
persisted directory is an ordinary DCP checkpoint.

* A rank's data file is one buffer of the cache: allocated at the file's
  size, written through the mapping, committed; the server persists it.
* ``.metadata`` is written by the coordinator in ``finish``, which DCP calls
  only after every rank's ``write_data`` returned, and each returns only
  once its file is committed: a checkpoint whose rank died has no
  ``.metadata`` and is never loaded. The coordinator also records the
  checkpoint as a complete tag (the directory's name) with every file.
* :class:`StorageWriter` is also DCP's ``AsyncStager``: under
  ``dcp.async_save`` its ``stage`` allocates the data file's buffer and lays
  the tensors out in it, and the copies run on TCE's staging thread; the
  fence (:func:`tce.wait_staged`, run by itself before every optimizer step)
  waits for them. No pinned copy, no extra process.
* :class:`StorageReader` reads each item's byte range from the node's cache
  (a leased file descriptor, nothing mapped), else through the ring, else
  from storage, copying each tensor's planned region once, straight into
  its destination; it records where each read came from in
  :attr:`StorageReader.reads`.
"""

from tce.integrations._dcp_format import METADATA
from tce.integrations._dcp_reader import ReadRecord, StorageReader
from tce.integrations._dcp_writer import StorageWriter

__all__ = ["METADATA", "ReadRecord", "StorageReader", "StorageWriter"]
