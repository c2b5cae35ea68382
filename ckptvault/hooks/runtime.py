"""The versions the training process runs with, as the hooks report them with each save: torch and the
CUDA it was built with, and each framework package that is already imported. Nothing is imported here:
a training process has what it has, and a hook must not load a framework it does not use."""

from __future__ import annotations

import sys
from importlib import metadata

# module name in sys.modules -> the distribution whose version is reported (the key: pip's name)
_PACKAGES = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("lightning", "lightning"),
    ("pytorch_lightning", "pytorch-lightning"),
    ("deepspeed", "deepspeed"),
    ("megatron.core", "megatron-core"),
    ("nemo", "nemo-toolkit"),
    ("orbax.checkpoint", "orbax-checkpoint"),
    ("jax", "jax"),
    ("accelerate", "accelerate"),
)


def runtime_versions() -> dict[str, str]:
    """{pip name: version} of the imported packages above, and `torch.cuda`: the CUDA version torch was
    built with (absent for a CPU build). Never raises: a package whose metadata does not read is left out."""
    out: dict[str, str] = {}
    for module, dist in _PACKAGES:
        if module not in sys.modules:
            continue
        try:
            out[dist] = metadata.version(dist)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if isinstance(cuda, str) and cuda:
        out["torch.cuda"] = cuda
    return out
