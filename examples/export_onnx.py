"""Export a model factory to ONNX with its parameter names and values preserved.

    python examples/export_onnx.py resnet50 -o resnet50.onnx
    python examples/export_onnx.py examples/models.py:tiny_gpt -o tiny_gpt.onnx

The model is exported in training mode with the torch.export-based exporter
and ``optimize=False``: the optimizer would fold BatchNorm into the
convolution weights and rename initializers, and the graph would no longer
name the model's parameters.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


def export(spec: str, output: str, *, batch_size: int | None = None) -> Path:
    """Export the factory ``spec`` (``file.py:name`` or a name in examples/models.py) to ``output``."""
    import torch

    from schedopt.importers import load_factory

    if ":" not in spec:
        spec = f"{HERE / 'models.py'}:{spec}"
    model_spec = load_factory(spec, batch_size=batch_size)
    model = model_spec.model.train()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, model_spec.example_inputs, str(out),
            dynamo=True, optimize=False, verbose=False,
            training=torch.onnx.TrainingMode.TRAINING,
            external_data=size > 1.5 * 2**30,  # protobuf caps one file at 2 GiB
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a factory name in examples/models.py, or path/to/file.py:factory")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    from schedopt.errors import SchedoptError

    try:
        path = export(args.model, args.output, batch_size=args.batch_size)
    except SchedoptError as exc:
        print(f"export_onnx: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.model} -> {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
