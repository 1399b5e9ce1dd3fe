"""SGLang-facing parts: exporting applied trees as importable packages, ``serve``, the engine adapter
and the token-forcing scorer client, and importing SGLang's sources on a CPU-only machine."""
