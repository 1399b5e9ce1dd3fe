"""SpecPilot's living GPU kernel library (import name ``specpilot_kernels``).

One folder per operation, in the style of flash-linear-attention's ``fla/ops/<op>/``: each kernel
file holds the Triton (or CUDA) kernel, its host wrapper and a public function whose docstring gives
every tensor's shape; ``reference.py`` beside it is the pure-torch definition of its exact semantics.
Imports only torch, triton, numpy and safetensors, so it runs unchanged on a bare GPU machine.
"""
