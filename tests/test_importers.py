"""Importers: aten, module and ONNX routes on the tiny example models."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import torch  # make setup installs it: a missing torch fails the suite, it does not shrink it

from schedopt import GraphImportError, TrainGraph  # noqa: E402
from schedopt.importers import from_onnx, from_torch, load_factory  # noqa: E402
from schedopt.load import ImportOptions, load_model  # noqa: E402

from .models_path import MODELS_FILE, example_models  # noqa: E402

models = example_models()


def step_flops(graph: TrainGraph) -> float:
    return sum(op.flops for op in graph.ops.values() if op.phase != "optimizer")


def import_route(name: str, level: str) -> TrainGraph:
    model, inputs, *loss = getattr(models, name)()
    return from_torch(model, inputs, loss_fn=loss[0] if loss else None, level=level, name=name)


def export_onnx(name: str, path, *, external_data: bool = False):
    model, inputs, *_ = getattr(models, name)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.train(), inputs, str(path), dynamo=True, optimize=False, verbose=False,
                          training=torch.onnx.TrainingMode.TRAINING, external_data=external_data)
    return path


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


def flop_counter_total(name: str) -> float:
    """FlopCounterMode's count for one real eager step (forward, loss, backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, inputs, *loss = getattr(models, name)()
    loss_fn = loss[0] if loss else (lambda out, *_: out.pow(2).mean())
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(*inputs), *inputs).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_gpt", "tiny_branches", "tiny_resnet", "tiny_bert"])
def test_aten_and_module_routes_agree_with_flop_counter(name):
    aten, module = import_route(name, "aten"), import_route(name, "module")
    model = getattr(models, name)()[0]
    expected = [n for n, p in model.named_parameters() if p.requires_grad]
    assert list(aten.params) == expected and list(module.params) == expected
    assert aten.params_fingerprint == module.params_fingerprint
    reference = flop_counter_total(name)
    assert step_flops(aten) == pytest.approx(reference, rel=1e-6)
    assert step_flops(module) == pytest.approx(reference, rel=0.10)
    for graph in (aten, module):
        for p in graph.params.values():
            assert graph.ops[p.grad_op].phase == "backward"


def test_aten_graph_has_separate_input_and_weight_gradients():
    graph = import_route("tiny_cnn", "aten")
    kinds = {op.kind for op in graph.ops.values()}
    assert "aten.convolution_backward.grad_weight" in kinds and "aten.convolution_backward.grad_input" in kinds
    conv1 = graph.params["conv1.weight"].grad_op
    assert graph.ops[conv1].kind == "aten.convolution_backward.grad_weight"
    assert graph.params["conv1.bias"].grad_op == conv1
    # the first convolution's input is data: no input gradient is computed for it
    assert f"{conv1.rsplit('.', 1)[0]}.grad_input" not in graph.ops
    fc = graph.ops[graph.params["fc.weight"].grad_op]
    assert fc.kind == "aten.mm" and fc.phase == "backward"
    assert all(graph.ops[o].phase == "forward" for o in graph.ops if o.startswith("convolution") and "." not in o)


def test_tied_weights_have_one_grad_op_after_accumulation(onnx_dir):
    aten = import_route("tiny_gpt", "aten")
    acc = aten.ops[aten.params["wte.weight"].grad_op]
    assert acc.kind == "aten.add"  # the engine sums the embedding's and the head's partial gradients
    assert len(list(aten.dag.predecessors(acc.id))) == 2
    module = import_route("tiny_gpt", "module")
    assert module.params["wte.weight"].grad_op == "wte.weight.accumulate_grad"
    onnx_graph = from_onnx(export_onnx("tiny_gpt", onnx_dir / "tiny_gpt.onnx"))
    assert onnx_graph.params["wte.weight"].grad_op == "wte.weight.accumulate_grad"
    assert list(onnx_graph.params) == list(aten.params)
    assert onnx_graph.params_fingerprint == aten.params_fingerprint



@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_gpt", "tiny_branches", "tiny_resnet", "tiny_bert",
                                  "tiny_inception", "tiny_vgg"])
def test_engine_order_fires_the_recorded_hooks_and_keeps_the_traced_timing(name):
    """The hooks' order holds, and only gradient-finishing ops leave the traced (real engine) order."""
    from schedopt.orders import engine_order, ready_order

    graph = import_route(name, "aten")
    order = engine_order(graph)
    assert ready_order(graph, order) == list(graph.grad_order)
    finishing = {p.grad_op for p in graph.params.values()}
    traced = [o for o in graph.ops if graph.ops[o].phase == "backward" and o not in finishing]
    assert [o for o in order if graph.ops[o].phase == "backward" and o not in finishing] == traced


def test_tied_head_weight_gradient_runs_where_the_engine_runs_it():
    """The head's weight-gradient matmul runs with its node, early; only the tied sum waits for the embedding."""
    from schedopt.orders import engine_order

    graph = import_route("tiny_gpt", "aten")
    backward = [o for o in engine_order(graph) if graph.ops[o].phase == "backward"]
    acc = graph.params["wte.weight"].grad_op
    head, embedding = sorted(graph.dag.predecessors(acc), key=backward.index)
    assert graph.ops[head].kind == "aten.mm" and graph.ops[embedding].kind == "aten.embedding_dense_backward"
    assert backward.index(head) < backward.index(graph.params["h.0.ln_1.weight"].grad_op) < backward.index(embedding)
    assert backward.index(head) < len(backward) // 4 and backward[-1] == acc

def test_frozen_parameters_and_buffers_are_not_parameters(onnx_dir):
    model, inputs, loss_fn = models.tiny_cnn()
    model.conv1.requires_grad_(False)
    for level in ("aten", "module"):
        graph = from_torch(model, inputs, loss_fn=loss_fn, level=level)
        assert "conv1.weight" not in graph.params and "conv1.bias" not in graph.params
        assert "bn1.running_mean" not in graph.params
        assert "conv2.weight" in graph.params
    onnx_path = export_onnx("tiny_cnn", onnx_dir / "tiny_cnn.onnx")
    full = from_onnx(onnx_path)
    assert "bn1.running_mean" not in full.params and "bn1.weight" in full.params
    assert list(full.params) == [n for n, _ in models.tiny_cnn()[0].named_parameters()]
    chosen = from_onnx(onnx_path, trainable=["fc.weight", "fc.bias"])
    assert list(chosen.params) == ["fc.weight", "fc.bias"]
    with pytest.raises(GraphImportError, match="not float initializers: nope"):
        from_onnx(onnx_path, trainable=["nope"])


def test_two_branch_model_gradient_waits_for_both_branches(onnx_dir):
    import networkx as nx

    for graph in (import_route("tiny_branches", "module"),
                  from_onnx(export_onnx("tiny_branches", onnx_dir / "tiny_branches.onnx"))):
        ancestors = nx.ancestors(graph.dag, graph.params["stem.weight"].grad_op)
        for branch in ("left.weight", "right1.weight"):
            reader = next(o.id for o in graph.ops.values() if o.phase == "forward" and branch in o.reads)
            assert f"{reader}.grad_input" in ancestors, (graph.name, branch)


def test_onnx_route_matches_torch_route(onnx_dir):
    path = export_onnx("tiny_resnet", onnx_dir / "tiny_resnet.onnx")
    onnx_graph, aten = from_onnx(path), import_route("tiny_resnet", "aten")
    assert onnx_graph.params_fingerprint == aten.params_fingerprint
    # ONNX counts element-wise arithmetic (batch norm, ReLU) that FlopCounterMode leaves out
    assert step_flops(onnx_graph) == pytest.approx(step_flops(aten), rel=0.10)


def test_corrupt_truncated_and_missing_onnx_files(tmp_path, onnx_dir):
    good = export_onnx("tiny_cnn", onnx_dir / "good.onnx").read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good[: len(good) // 3])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07this is not a model" * 10)
    for path in (truncated, garbage):
        with pytest.raises(GraphImportError, match="corrupt|truncated|no graph|checker"):
            from_onnx(path)
    with pytest.raises(GraphImportError, match="does not exist"):
        from_onnx(tmp_path / "absent.onnx")


def test_truncated_and_missing_external_data_files(tmp_path):
    path = export_onnx("tiny_cnn", tmp_path / "external.onnx", external_data=True)
    data_files = [p for p in tmp_path.iterdir() if p.name != "external.onnx"]
    assert data_files, "the exporter wrote no external data file"
    assert from_onnx(path).params  # loads while the data is there
    for p in data_files:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(GraphImportError, match="external data file .* is truncated: initializer .* needs bytes up to"):
        from_onnx(path)
    for p in data_files:
        p.unlink()
    with pytest.raises(GraphImportError, match="external data file .* is missing"):
        from_onnx(path)


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # control flow on a value: no static trace exists
            return y * 2
        return y


class Unused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.spare = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def test_untraceable_and_unused_parameters_raise_graph_import_error():
    with pytest.raises(GraphImportError, match="level='module'"):
        from_torch(DataDependent(), torch.randn(2, 4))
    with pytest.raises(GraphImportError, match="unused by the loss.*spare.weight"):
        from_torch(Unused(), torch.randn(2, 4))
    with pytest.raises(GraphImportError, match="do not reach the loss: spare.weight"):
        from_torch(Unused(), torch.randn(2, 4), level="module")


def test_factories_and_model_specs(tmp_path):
    spec = load_factory(f"{MODELS_FILE}:tiny_branches", batch_size=3)
    assert spec.example_inputs[0].shape[0] == 3
    with pytest.raises(GraphImportError, match="has no factory 'nope'; functions there: .*tiny_cnn"):
        load_factory(f"{MODELS_FILE}:nope")
    with pytest.raises(GraphImportError, match="does not exist"):
        load_factory(f"{tmp_path}/none.py:f")
    broken = tmp_path / "broken.py"
    broken.write_text("def make():\n    raise RuntimeError('no GPU here')\n\ndef bad():\n    return 3\n")
    with pytest.raises(GraphImportError, match="factory 'make' failed: RuntimeError: no GPU here"):
        load_factory(f"{broken}:make")
    with pytest.raises(GraphImportError, match="must return"):
        load_factory(f"{broken}:bad")
    graph = load_model(f"{MODELS_FILE}:tiny_cnn", ImportOptions(level="module", device="h100"))
    assert graph.meta["device"] == "h100"
    with pytest.raises(GraphImportError, match="expected a graph .json, an .onnx file"):
        load_model("model.pt")


def test_cli_import_and_profile(tmp_path):
    out = tmp_path / "g.json"
    run = lambda *a: subprocess.run([sys.executable, "-m", "schedopt", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300)
    result = run("import", f"{MODELS_FILE}:tiny_cnn", "-o", str(out), "--device", "h100")
    assert result.returncode == 0, result.stderr
    imported = TrainGraph.load(out)
    assert imported.meta["importer"] == "torch.aten" and imported.meta["device"] == "h100"
    profiled_path = tmp_path / "profiled.json"
    result = run("profile", f"{MODELS_FILE}:tiny_cnn", "--iterations", "3", "--progress", "-o", str(profiled_path))
    assert result.returncode == 0, result.stderr
    assert "measured step" in result.stdout
    assert "profile: " in result.stderr and "/5 [" in result.stderr  # the bar: 2 warm-up iterations and 3 timed
    profiled = TrainGraph.load(profiled_path)
    assert profiled.meta["costs"] == "profiled"
    # gradient statistics for osp's stage-2 choice: every parameter, finite and non-negative
    ratios = profiled.meta["grad_to_weight"]
    assert set(ratios) == set(profiled.params) and all(0 <= r < float("inf") for r in ratios.values())
    # the real-tensor trace has the op structure of the fake-tensor import: plans made on one fit the other
    assert profiled.fingerprint == imported.fingerprint
    bad = run("import", f"{MODELS_FILE}:tiny_cnn", "--device", "tpu9")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown device 'tpu9'" in bad.stderr


def test_profiled_op_times_add_up_to_the_measured_step():
    """The ops timed one by one leave out the engine's time between them; the profiled graph's forward
    and backward are scaled up to the eager step's compute, never down."""
    from schedopt.importers.profile import profile_torch

    spec = load_factory(f"{MODELS_FILE}:tiny_gpt")
    graph, report = profile_torch(spec.model, spec.example_inputs, loss_fn=spec.loss_fn, iterations=3)
    compute = graph.totals.forward_s + graph.totals.backward_s
    assert graph.meta["overhead"] == report.overhead >= 0
    if report.overhead > 0:  # measured here: +14%
        assert compute == pytest.approx(report.measured_step_s - report.optimizer_s, rel=1e-9)
    else:  # timed apart, the ops took longer than the step: kept as timed
        assert compute >= report.measured_step_s - report.optimizer_s
    assert compute == pytest.approx((report.predicted_step_s - report.optimizer_s) * (1 + report.overhead), rel=1e-9)


def test_overhead_scale_never_scales_down_and_leaves_other_ops_alone():
    from schedopt.cost import overhead_scale
    from schedopt.synthetic import chain

    graph = chain(3)
    fwd_bwd = [op for op in graph.ops.values() if op.phase in ("forward", "backward")]
    measured = {op.id: op.duration_s for op in fwd_bwd[:2]}
    others = sum(op.duration_s for op in fwd_bwd[2:])
    total = sum(measured.values())
    assert overhead_scale(graph, measured, others + 1.5 * total) == pytest.approx(1.5)
    assert overhead_scale(graph, measured, others + 0.5 * total) == 1.0
    assert overhead_scale(graph, {}, 1.0) == 1.0


@pytest.mark.parametrize("name", [n for n in example_models().__all__ if n.startswith(("tiny_", "digits"))])
def test_every_example_trains_where_its_model_is_moved(name):
    """An example's loss takes its labels to the model's device (a GPU run of ResNet-18 failed on CPU
    labels): on the meta device, the step's loss is a meta tensor."""
    spec = load_factory(f"{MODELS_FILE}:{name}", batch_size=2)
    model = spec.model.to("meta")
    inputs = tuple(x.to("meta") for x in spec.example_inputs)
    assert spec.loss_fn(model(*inputs), *inputs).device.type == "meta"
