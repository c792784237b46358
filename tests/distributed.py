"""Run a function on N gloo ranks in processes of their own, with a timeout so that a hang fails fast.

Starting a rank costs seconds (an interpreter importing torch and joining a
gloo group), more than most checks run, so the ranks of each world size are
kept: a :class:`RankPool` starts them once per test process, joins
them in one gloo group, and runs one task after another on them. A task
leaves nothing behind that the next one sees: the environment is restored,
torch.compile's caches are reset, and a pool whose task failed, hung or
timed out is torn down and spawned afresh for the next task (a failing rank
may have left the group mid-collective). ``run_ranks(..., fresh=True)`` runs
on ranks of their own, for a task that must be the first thing its process
does.

The ranks are forked from a server process that has imported torch and the
runtime once (multiprocessing's ``forkserver`` with those modules preloaded):
a rank then starts in a fraction of a second instead of 1.5-2 s of CPU for a
fresh interpreter's imports. A rank inherits nothing of the test process but
the environment the server started with (its first pool's); a task that needs
a variable sets it. Where the platform has no ``forkserver``, they are spawned.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import socket
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["RankError", "run_ranks", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What the rank server imports once, before it forks any rank (see the module docstring).
PRELOAD = ["torch", "torch.distributed", "schedopt.runtime"]


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context with :data:`PRELOAD`, or spawn where there is no forkserver."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


#: How often an idle rank checks that the process that spawned it is still there.
PARENT_POLL_S = 2.0


def _serve(rank: int, world_size: int, port: int, tasks, results) -> None:
    """A pool rank: join the group, then run tasks until told to stop (None)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
        results.put((rank, "error", (type(exc).__name__, str(exc), traceback.format_exc())))
        return
    while (task := _next_task(tasks)) is not None:
        target, args, kwargs = task
        environ = dict(os.environ)
        try:
            results.put((rank, "ok", target(rank, world_size, *args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001
            results.put((rank, "error", (type(exc).__name__, str(exc), traceback.format_exc())))
        finally:
            os.environ.clear()
            os.environ.update(environ)
            if "torch._dynamo" in sys.modules:  # (importing it only to reset it costs 1.5 s of CPU)
                torch._dynamo.reset()  # no recompile limit carried from one task's models to the next
            torch.set_num_threads(1)
    dist.destroy_process_group()


def _next_task(tasks) -> tuple | None:
    """The next task, or None when told to stop. A rank whose test process is gone exits: one that left
    without closing its pool (as a test process may) would leave the rank waiting on its queue forever,
    its own copy of the queue's write end keeping the pipe open, and every run of the suite would leave
    ranks behind."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            return tasks.get(timeout=PARENT_POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                os._exit(0)  # nobody to answer to, and no teardown that could wait on a peer


def rank_pid(rank: int, world_size: int) -> int:
    """A task: the rank's process id."""
    return os.getpid()


class RankError(AssertionError):
    """A rank raised; ``errors`` maps rank -> (exception type name, message)."""

    def __init__(self, errors: dict[int, tuple[str, str, str]]) -> None:
        self.errors = {rank: (kind, message) for rank, (kind, message, _) in errors.items()}
        details = "\n".join(f"rank {rank}: {tb}" for rank, (_, _, tb) in sorted(errors.items()))
        super().__init__(f"ranks {sorted(errors)} raised:\n{details}")


class RankPool:
    """``world_size`` gloo ranks that run tasks one after another (see the module docstring)."""

    def __init__(self, world_size: int) -> None:
        ctx = _context()
        self.world_size = world_size
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        self.procs = [ctx.Process(target=_serve, args=(rank, world_size, port, self.tasks[rank], self.results),
                                  daemon=True) for rank in range(world_size)]
        for p in self.procs:
            p.start()

    def run(self, target: Callable[..., Any], args: tuple, kwargs: dict, timeout_s: float) -> dict[int, tuple]:
        """Run ``target`` on every rank; return ``rank -> (status, value)`` of the ranks that answered in time."""
        for q in self.tasks:
            q.put((target, args, kwargs))
        deadline = time.monotonic() + timeout_s
        got: dict[int, tuple[str, Any]] = {}
        while len(got) < self.world_size:
            try:
                rank, status, value = self.results.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            got[rank] = (status, value)
            if status == "error":  # the others may wait for it in a collective: give them a moment
                deadline = min(deadline, time.monotonic() + 15)
        return got

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self, *, kill: bool = False) -> None:
        if not kill:
            for q in self.tasks:
                q.put(None)
        for p in self.procs:
            p.join(timeout=0 if kill else 5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


_POOLS: dict[int, RankPool] = {}
#: What spawning a pool may take on top of a task's timeout (interpreters importing torch, the rendezvous).
STARTUP_S = 30.0


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def run_ranks(target: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 90.0,
              fresh: bool = False, **kwargs: Any) -> list[Any]:
    """Return ``[target(rank, world_size, *args, **kwargs) for each rank]``, each rank its own process.

    ``target`` must be importable by the spawned ranks (a module-level function). With ``fresh``,
    the ranks are spawned for this call alone.

    Raises:
        RankError: some rank raised (all ranks are waited for, or killed at the deadline).
        TimeoutError: a rank neither returned nor raised within ``timeout_s`` (a hang).
    """
    pool = None if fresh else _POOLS.pop(world_size, None)
    startup_s = 0.0
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close(kill=True)
        pool, startup_s = RankPool(world_size), STARTUP_S
    got = pool.run(target, args, kwargs, timeout_s + startup_s)
    clean = len(got) == world_size and all(status == "ok" for status, _ in got.values())
    if clean and not fresh:
        _POOLS[world_size] = pool
    else:
        pool.close(kill=len(got) < world_size)
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    if errors:
        raise RankError(errors)
    if len(got) < world_size:
        raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(got))} did not finish within {timeout_s} s")
    return [got[r][1] for r in range(world_size)]
