"""Run a function on N gloo ranks in spawned processes, with a timeout so that a hang fails fast."""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(target: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, kwargs: dict,
           results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        results.put((rank, "ok", target(rank, world_size, *args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
        results.put((rank, "error", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class RankError(AssertionError):
    """A rank raised; ``errors`` maps rank -> (exception type name, message)."""

    def __init__(self, errors: dict[int, tuple[str, str, str]]) -> None:
        self.errors = {rank: (kind, message) for rank, (kind, message, _) in errors.items()}
        details = "\n".join(f"rank {rank}: {tb}" for rank, (_, _, tb) in sorted(errors.items()))
        super().__init__(f"ranks {sorted(errors)} raised:\n{details}")


def run_ranks(target: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 90.0,
              **kwargs: Any) -> list[Any]:
    """Return ``[target(rank, world_size, *args, **kwargs) for each rank]``, each run in its own process.

    Raises:
        RankError: some rank raised (all ranks are waited for, or killed at the deadline).
        TimeoutError: a rank neither returned nor raised within ``timeout_s`` (a hang).
    """
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(target, rank, world_size, port, args, kwargs, results), daemon=True)
             for rank in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    got: dict[int, tuple[str, Any]] = {}
    try:
        while len(got) < world_size:
            try:
                rank, status, value = results.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(got))} did not finish within "
                                   f"{timeout_s} s") from None
            got[rank] = (status, value)
            if status == "error":  # the others may wait for it in a collective: give them a moment
                deadline = min(deadline, time.monotonic() + 15)
    except TimeoutError:
        errors = {r: v for r, (s, v) in got.items() if s == "error"}
        if errors:
            raise RankError(errors) from None
        raise
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    if errors:
        raise RankError(errors)
    return [got[r][1] for r in range(world_size)]
