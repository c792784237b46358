"""Check the environment torchrun sets before joining a process group from it.

``torch.distributed.init_process_group()`` reads ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (``LOCAL_RANK`` picks the GPU). When one is
unset, empty or not a number it fails with a traceback from deep inside
torch; every schedopt entry that joins a group checks them here first and
raises one :class:`~schedopt.errors.LaunchError` naming the variable.

Example:
    >>> check_rendezvous_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    Rendezvous(rank=0, world_size=2, local_rank=0)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .errors import LaunchError

__all__ = ["Rendezvous", "check_rendezvous_env", "RENDEZVOUS_VARS"]

#: What ``init_process_group()`` with the default ``env://`` method needs.
RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, slots=True)
class Rendezvous:
    rank: int
    world_size: int
    local_rank: int


def check_rendezvous_env(environ: Mapping[str, str] | None = None, *, what: str = "this command") -> Rendezvous:
    """Return the rank, world size and local rank torchrun set, or raise naming the variable at fault.

    Raises:
        LaunchError: a variable of :data:`RENDEZVOUS_VARS` is unset or empty, a number is not an
            integer in range, or ``LOCAL_RANK`` is set but not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    how = f"run {what} under torchrun (torchrun --nproc-per-node 2 ...)"
    unset = [name for name in RENDEZVOUS_VARS if name not in env]
    if unset:
        raise LaunchError(f"{', '.join(unset)} not set: {how}")
    empty = [name for name in RENDEZVOUS_VARS if not env[name].strip()]
    if empty:
        raise LaunchError(f"{', '.join(empty)} set but empty: {how}")
    rank = _integer(env, "RANK", 0)
    world_size = _integer(env, "WORLD_SIZE", 1)
    port = _integer(env, "MASTER_PORT", 1)
    if port > 65535:
        raise LaunchError(f"MASTER_PORT={port} is not a TCP port (1 to 65535)")
    if rank >= world_size:
        raise LaunchError(f"RANK={rank} is not below WORLD_SIZE={world_size}")
    if "LOCAL_RANK" in env and not env["LOCAL_RANK"].strip():
        raise LaunchError(f"LOCAL_RANK set but empty: {how}")
    local_rank = _integer(env, "LOCAL_RANK", 0) if "LOCAL_RANK" in env else 0
    return Rendezvous(rank=rank, world_size=world_size, local_rank=local_rank)


def _integer(env: Mapping[str, str], name: str, least: int) -> int:
    text = env[name].strip()
    try:
        value = int(text)
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not an integer") from None
    if value < least:
        raise LaunchError(f"{name}={value} must be at least {least}")
    return value
