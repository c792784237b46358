"""Join the process group torchrun describes, after checking its environment (one line when it is wrong)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from schedopt.rendezvous import Rendezvous, check_rendezvous_env

__all__ = ["join_process_group"]


def join_process_group(backend: str | None = None, *, what: str = "this command", **options: Any) -> Rendezvous:
    """Check torchrun's variables, pick the GPU of the local rank, and ``init_process_group``.

    Args:
        backend: ``nccl`` or ``gloo``; by default NCCL with CUDA (one GPU per local rank), else gloo.
        what: the command named in the error message.
        options: passed to ``init_process_group`` (``timeout``, ...).

    Raises:
        LaunchError: a rendezvous variable is unset, empty or malformed (before torch reads it).
    """
    where = check_rendezvous_env(what=what)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(where.local_rank)
    dist.init_process_group(backend, **options)
    return where
