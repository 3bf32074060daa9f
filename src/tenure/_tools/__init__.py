"""tenure's tools: the CLI, ``tenure ingest`` and the demos.

The benchmarks are not in the wheel: they are the clone's ``benchmarks/``.

They use the library through its public API and :mod:`tenure._tooling`, the one
seam where they reach what is not public; never ``tenure._async``/``tenure._sync``.
"""
