"""Exact replay (§3.1, §4.2, §6.4): recorded drafter lattices, draft-tree builders, greedy tree
verification and τ(N) per builder. Format: ``docs/lattice-format.md``.

Everything here runs on the CPU with numpy; the engine calls ``lattice.LatticeRecorder`` and the
builders in ``replay.trees``.
"""
