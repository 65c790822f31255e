"""The client core: the session with the node's server and what a save or a
load does in this process (layout, staging, loading from a mapping, files,
settings, rank and world size, the ring, the metadata reader).

Internal: the public API is what ``tce`` re-exports, and :mod:`tce.core.dist`
(rank, world size, the collectives, the ring) is public to TCE's
integrations and tools only. Nothing here imports ``tce.api``,
``tce._service``, the integrations or the tools.
"""
