"""Import every example model by every route; print ops, parameters, time, peak memory and FLOPs.

    python bench/import_speed.py                      # all models, all routes
    python bench/import_speed.py --models resnet50 --routes aten,onnx

Each import runs in its own process, so "peak MiB" is that process's peak
resident memory (model construction included). The ONNX route imports a file
exported once beforehand (export time not counted). "vs FlopCounter" compares
a route's step FLOPs with ``FlopCounterMode`` counting one forward+backward
step under fake tensors. Targets: aten import of resnet50 and gpt2_small under
30 s and 4 GiB; ONNX import of resnet50 under 10 s; the routes' parameter sets
equal and their FLOPs within 10%.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import begin, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models.py"
ALL_MODELS = ["resnet50", "vgg16", "inception", "gpt2_small", "bert_base"]
ALL_ROUTES = ["aten", "module", "onnx"]


def _flop_counter_total(model, inputs, loss_fn) -> float:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.utils.flop_counter import FlopCounterMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    params = {n: mode.from_tensor(p) for n, p in model.named_parameters() if p.requires_grad}
    with mode, FlopCounterMode(display=False) as counter:
        fake_inputs = tuple(mode.from_tensor(x) for x in inputs)
        loss = loss_fn(functional_call(model, params, fake_inputs), *fake_inputs)
        torch.autograd.grad(loss, list(params.values()))
    return float(counter.get_total_flops())


def run_one(model_name: str, route: str, onnx_path: str | None, *, seed: int = 0) -> dict:
    """Import one model by one route in this process and return the figures."""
    import torch

    from schedopt.importers import from_onnx, from_torch, load_factory

    torch.manual_seed(seed)

    started = time.perf_counter()
    spec = load_factory(f"{MODELS}:{model_name}")
    reference = None
    if route == "onnx":
        graph = from_onnx(onnx_path, name=model_name)
    else:
        graph = from_torch(spec.model, spec.example_inputs, loss_fn=spec.loss_fn, level=route, name=model_name)
    elapsed = time.perf_counter() - started
    if route == "aten":
        reference = _flop_counter_total(spec.model, spec.example_inputs, spec.loss_fn)
    return {
        "model": model_name,
        "route": route,
        "ops": len(graph.ops),
        "params": len(graph.params),
        "param_names": list(graph.params),
        "import_s": elapsed,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_flops": sum(op.flops for op in graph.ops.values() if op.phase != "optimizer"),
        "flop_counter": reference,
    }


def export(model_name: str, out_dir: Path) -> Path:
    path = out_dir / f"{model_name}.onnx"
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "examples" / "export_onnx.py"), model_name, "-o", str(path)],
                       check=True, capture_output=True, text=True, timeout=900)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ALL_MODELS))
    parser.add_argument("--routes", default=",".join(ALL_ROUTES))
    parser.add_argument("--onnx-dir", default=str(ROOT / "out" / "bench" / "onnx"))
    parser.add_argument("--seed", type=int, default=0, help="torch's seed before each factory runs")
    parser.add_argument("--json", help="write the rows here, with the commit and the machine")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "ROUTE", "ONNX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.one:
        print(json.dumps(run_one(*args.one, seed=args.seed)))
        return 0

    begin()
    onnx_dir = Path(args.onnx_dir)
    onnx_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for model_name in args.models.split(","):
        for route in args.routes.split(","):
            onnx_path = str(export(model_name, onnx_dir)) if route == "onnx" else "-"
            proc = subprocess.run([sys.executable, __file__, "--one", model_name, route, onnx_path,
                                   "--seed", str(args.seed)],
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                print(f"{model_name} {route}: FAILED\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"  {model_name:<11} {route:<6} {r['ops']:>5} ops {r['import_s']:6.1f}s", file=sys.stderr)

    print(f"{'model':<11} {'route':<7} {'ops':>6} {'params':>6} {'import s':>9} {'peak MiB':>9} "
          f"{'GFLOP/step':>11} {'vs aten':>8} {'vs FlopCounter':>15} {'same params':>12}")
    for model_name in args.models.split(","):
        group = {r["route"]: r for r in rows if r["model"] == model_name}
        aten = group.get("aten")
        for route, r in group.items():
            vs_aten = f"{r['step_flops'] / aten['step_flops'] - 1:+.1%}" if aten else "-"
            reference = aten["flop_counter"] if aten else None
            vs_counter = f"{r['step_flops'] / reference - 1:+.1%}" if reference else "-"
            same = "yes" if aten and r["param_names"] == aten["param_names"] else ("-" if not aten else "NO")
            print(f"{model_name:<11} {route:<7} {r['ops']:>6} {r['params']:>6} {r['import_s']:>9.2f} "
                  f"{r['peak_mib']:>9.0f} {r['step_flops'] / 1e9:>11.1f} {vs_aten:>8} {vs_counter:>15} {same:>12}")
    if args.json:
        write_result(args.json, rows, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
