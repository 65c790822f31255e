"""The ``tce`` command and what it runs: the CLI, the benchmarks, the demo,
the fabric doctor, the server launcher and network namespaces for tests.
They call the public API and the internal service API (:mod:`tce._service`).
"""
