"""The cost model of §3.1: byte floors per kernel class, the ceiling factorization and S(N).

``profile`` reads the profile format (``docs/profile-format.md``), ``floors`` turns a kernel class
into its byte floor on a GPU of ``specpilot_mem.gpus``, ``ceiling`` factors the ceiling.
"""
