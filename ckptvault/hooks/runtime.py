"""The versions the training process runs with, as the hooks report them with each save: torch and the
CUDA it was built with, and each framework package that is already imported. Nothing is imported here:
a training process has what it has, and a hook must not load a framework it does not use."""

from __future__ import annotations

import functools
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
    built with (absent for a CPU build). Never raises: a package whose metadata does not read is left out.
    Each distinct set of imported packages is looked up once (~5 ms): the hook calls this with every save."""
    present = tuple(dist for module, dist in _PACKAGES if module in sys.modules)
    out = dict(_versions(present))
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if isinstance(cuda, str) and cuda:
        out["torch.cuda"] = cuda
    return out


@functools.lru_cache(maxsize=16)
def _versions(dists: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for dist in dists:
        try:
            out.append((dist, metadata.version(dist)))
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return tuple(out)
