"""tenure's tools: the CLI, ``tenure inspect``, the demos and the benchmarks.

They use the library through its public API and :mod:`tenure._tooling`, the one
seam where they reach what is not public; never ``tenure._async``/``tenure._sync``.
"""
