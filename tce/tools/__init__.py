"""The ``tce`` command and what it runs: the CLI, the benchmarks, the demo,
the fabric doctor, the server launcher and network namespaces for tests.
They call the public API (:mod:`tce.api`, :mod:`tce.client`,
:mod:`tce.buffers`, :mod:`tce.objects`) and :mod:`tce.core.dist` (rank,
world size, the ring), never another package's private modules.
"""
