"""Model front ends (ONNX, torch.fx / AOTAutograd) that build a ``TrainGraph``.

Not written yet (tracked by the importers issue); until then graphs come from
:mod:`schedopt.synthetic` or from graph JSON files.
"""

__all__: list[str] = []
