"""What the benchmark scripts under ``benchmarks/`` share: ``cuda_timing`` (CUDA-graph replay timing, sections that
survive each other's failures, the SM clock log, the read bandwidth behind the byte floors), ``runs`` (progress
to stderr, the request subset of the paired runs, commands timed in fresh processes) and ``shapes`` (the GEMM
shapes the W12 and Q-pass benchmarks time).

The GPU machine has only torch, triton, numpy and safetensors: these modules import nothing else (the standard
library, ``specpilot_mem.provenance`` and the controller's request sets, which need no more). Like the package
itself, this file imports nothing."""
