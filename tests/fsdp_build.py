"""Build every sharded solver's units with torch's ``fully_shard`` on meta-device example models.

Run by tests/test_sharded.py in its own process (it starts a one-rank gloo group). For each example
model: import its graph, plan it with every sharded solver, build the model on the meta device,
``fully_shard`` each unit (the deepest modules first, the root last), and check that FSDP2's
parameter group of each unit holds exactly the parameters the plan lists, and that no plan beats the
sharded lower bound.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schedopt import Cluster, Problem  # noqa: E402
from schedopt.load import ImportOptions, load_model  # noqa: E402
from schedopt.shard_sim import sharded_lower_bound  # noqa: E402
from schedopt.solvers import get, solvers_for  # noqa: E402
from schedopt.solvers.fine_units import pipelined_plan  # noqa: E402
from importers.factory import load_factory  # noqa: E402

MODELS = ("tiny_gpt", "tiny_bert", "tiny_resnet", "tiny_vgg", "tiny_inception")


def build(spec: str, units) -> None:
    with torch.device("meta"):
        model = load_factory(spec).model
    mesh = init_device_mesh("cpu", (1,))
    modules = dict(model.named_modules())
    for unit in sorted(units, key=lambda u: -min(m.count(".") + (m != "") for m in u.modules)):
        targets = [modules[m] for m in unit.modules]
        fully_shard(targets if len(targets) > 1 else targets[0], mesh=mesh,
                    reshard_after_forward=unit.reshard_after_forward)
    names = {id(p): n for n, p in model.named_parameters()}
    for unit in units:
        state = fully_shard.state(modules[unit.modules[0]])
        group = state._fsdp_param_group
        got = {names[id(fp.sharded_param)] for fp in group.fsdp_params}
        assert got == set(unit.params), (spec, unit.modules, sorted(got ^ set(unit.params))[:4])


def main() -> int:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    count = 0
    for name in MODELS:
        spec = f"{ROOT / 'examples' / 'models.py'}:{name}"
        graph = load_model(spec, ImportOptions(device="a100", level="module"))
        problem = Problem(graph=graph, cluster=Cluster.preset("100gbe", world_size=8), mode="sharded")
        plans = [get(solver)(problem, **({"time_limit_s": 1} if solver == "cpsat" else {}))
                 for solver in solvers_for("sharded")]
        pipelined = pipelined_plan(problem)  # the finest units: a block's own layers, several blocks' in one unit
        for plan in plans + ([pipelined] if pipelined is not None else []):
            # real graphs: tied weights, several reads per parameter; with no budget, and with the plan's own peak
            for budget in (None, math.ceil(plan.predicted.peak_memory_bytes)):
                bound = sharded_lower_bound(replace(problem, memory_budget_bytes=budget))
                assert bound <= plan.predicted.iteration_s * (1 + 1e-9), (name, plan.solver.name, budget, bound,
                                                                          plan.predicted.iteration_s)
            build(spec, plan.units)
            count += len(plan.units)
    dist.destroy_process_group()
    print(f"{count} units built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
