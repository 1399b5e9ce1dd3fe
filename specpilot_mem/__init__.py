"""SpecPilot: memory and patch management around an SGLang fork.

Kept import-free on purpose: the pure-torch engine under ``specpilot_mem.engine`` must import on
machines that have only torch, triton, numpy and safetensors (the lent H200).
"""

__version__ = "0.1.0"
