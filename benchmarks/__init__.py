"""The benchmark scripts (each run as ``python benchmarks/<name>.py``); a package so that tests import them as
modules (``from benchmarks import w12_sass``). What they share lives in ``specpilot_mem.bench``."""
