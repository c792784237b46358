"""Synthetic training graphs for tests, benchmarks and the demo.

Each generator describes a forward pass with realistic parameter sizes and
FLOP counts, and :func:`schedopt.backward.training_graph` adds the backward
pass, the optimizer and roofline durations on a device (``a100`` default).

- :func:`chain` — n linear layers in a row.
- :func:`diamond` — one layer feeding two branches that join again.
- :func:`branches` — a stem, k parallel two-layer branches, a head.
- :func:`transformer_like` — a GPT-2-style decoder (tied embedding).
"""

from __future__ import annotations

from typing import Literal

from .backward import ForwardOp, ParamSpec, training_graph
from .cost import DeviceSpec
from .graph import TrainGraph

__all__ = ["chain", "diamond", "branches", "transformer_like", "GENERATORS"]

_F32 = 4


class _Builder:
    """Collect forward ops and parameters; costs assume float32 activations."""

    def __init__(self, tokens: int, *, fine: bool = False) -> None:
        self.tokens = tokens
        self.fine = fine  # aten granularity: one op per aten kernel (and views, which cost nothing)
        self.ops: list[ForwardOp] = []
        self.params: list[ParamSpec] = []

    def view(self, name: str, inputs: tuple[str, ...]) -> str:
        self.ops.append(ForwardOp(id=name, kind="view", inputs=inputs))
        return name

    def steps(self, name: str, inputs: tuple[str, ...], numel: int, kinds: list[tuple[str, float]]) -> str:
        """A chain of element-wise kernels ``(kind, flops per element)`` over ``numel`` elements."""
        prev = inputs
        for k, (kind, flops) in enumerate(kinds):
            prev = (self.pointwise(f"{name}.{k}.{kind}", kind, prev, numel, flops_per_elem=flops),)
        return prev[0]

    def param(self, name: str, *shape: int) -> str:
        self.params.append(ParamSpec(name=name, shape=shape))
        return name

    def linear(self, name: str, inputs: tuple[str, ...], d_in: int, d_out: int, *, bias: bool = True,
               weight: str | None = None) -> str:
        w = weight or self.param(f"{name}.weight", d_out, d_in)
        b = self.param(f"{name}.bias", d_out) if bias else None
        flops = 2.0 * self.tokens * d_in * d_out
        nbytes = _F32 * (self.tokens * (d_in + d_out) + d_in * d_out)
        if not self.fine:
            self.ops.append(ForwardOp(id=name, kind="linear", inputs=inputs, reads=(w,) if b is None else (w, b),
                                      flops=flops, bytes_moved=nbytes))
            return name
        x = self.view(f"{name}.view_in", inputs)
        self.ops.append(ForwardOp(id=f"{name}.mm", kind="mm", inputs=(x,), reads=(w,), flops=flops,
                                  bytes_moved=nbytes))
        out = f"{name}.mm"
        if b is not None:
            out = self.pointwise(f"{name}.bias_add", "add", (out,), self.tokens * d_out, reads=(b,))
        return self.view(f"{name}.view_out", (out,))

    def norm(self, name: str, inputs: tuple[str, ...], width: int) -> str:
        reads = (self.param(f"{name}.weight", width), self.param(f"{name}.bias", width))
        numel = self.tokens * width
        if not self.fine:
            self.ops.append(ForwardOp(id=name, kind="layer_norm", inputs=inputs, reads=reads,
                                      flops=8.0 * numel, bytes_moved=2 * _F32 * numel))
            return name
        normed = self.steps(name, inputs, numel, [("mean", 1), ("sub", 1), ("pow", 1), ("var_mean", 1),
                                                  ("add_eps", 1), ("rsqrt", 1), ("mul", 1)])
        scaled = self.pointwise(f"{name}.scale", "mul", (normed,), numel, reads=(reads[0],))
        return self.pointwise(f"{name}.shift", "add", (scaled,), numel, reads=(reads[1],))

    def pointwise(self, name: str, kind: str, inputs: tuple[str, ...], numel: int, *, flops_per_elem: float = 1.0,
                  reads: tuple[str, ...] = ()) -> str:
        self.ops.append(ForwardOp(id=name, kind=kind, inputs=inputs, reads=reads, flops=flops_per_elem * numel,
                                  bytes_moved=_F32 * numel * (len(inputs) + 1)))
        return name

    def build(self, name: str, device: str | DeviceSpec, **meta: object) -> TrainGraph:
        spec = device if isinstance(device, DeviceSpec) else DeviceSpec.preset(device)
        return training_graph(name, self.ops, self.params, device=spec, meta={"generator": name, **meta})


def chain(num_layers: int, *, width: int = 1024, tokens: int = 4096, device: str | DeviceSpec = "a100") -> TrainGraph:
    """Return ``num_layers`` linear layers in a row with a mean-squared loss.

    Widths alternate between ``width`` and ``width // 2`` so that parameter
    sizes differ from layer to layer.
    """
    if num_layers < 1:
        raise ValueError(f"chain needs num_layers >= 1, got {num_layers}")
    b = _Builder(tokens)
    prev: tuple[str, ...] = ()
    d_in = width
    for i in range(num_layers):
        d_out = width if i % 2 else width // 2
        prev = (b.linear(f"layer{i}", prev, d_in, d_out),)
        d_in = d_out
    b.pointwise("loss", "mse_loss", prev, tokens * d_in, flops_per_elem=3.0)
    return b.build(f"chain{num_layers}", device)


def diamond(*, width: int = 1024, tokens: int = 4096, device: str | DeviceSpec = "a100") -> TrainGraph:
    """Return a -> (b, c) -> d -> loss: two branches that join."""
    b = _Builder(tokens)
    a = b.linear("a", (), width, width)
    left = b.linear("b", (a,), width, width)
    right = b.linear("c", (a,), width, 2 * width)
    right = b.linear("c2", (right,), 2 * width, width)
    join = b.pointwise("join", "add", (left, right), tokens * width)
    d = b.linear("d", (join,), width, width // 4)
    b.pointwise("loss", "mse_loss", (d,), tokens * width // 4, flops_per_elem=3.0)
    return b.build("diamond", device)


def branches(k: int, *, width: int = 512, tokens: int = 4096, device: str | DeviceSpec = "a100") -> TrainGraph:
    """Return a stem, ``k`` parallel two-layer branches of growing width, and a head."""
    if k < 1:
        raise ValueError(f"branches needs k >= 1, got {k}")
    b = _Builder(tokens)
    stem = b.linear("stem", (), width, width)
    ends = []
    for i in range(k):
        hidden = width * (i + 1)
        mid = b.linear(f"branch{i}.fc1", (stem,), width, hidden)
        mid = b.pointwise(f"branch{i}.relu", "relu", (mid,), tokens * hidden)
        ends.append(b.linear(f"branch{i}.fc2", (mid,), hidden, width))
    cat = b.pointwise("concat", "cat", tuple(ends), tokens * width * k, flops_per_elem=0.0)
    head = b.linear("head", (cat,), width * k, width)
    b.pointwise("loss", "mse_loss", (head,), tokens * width, flops_per_elem=3.0)
    return b.build(f"branches{k}", device)


def transformer_like(
    num_layers: int,
    *,
    hidden: int = 768,
    num_heads: int = 12,
    seq_len: int = 1024,
    batch_size: int = 8,
    vocab_size: int = 50257,
    device: str | DeviceSpec = "a100",
    granularity: Literal["module", "aten"] = "module",
) -> TrainGraph:
    """Return a GPT-2-style decoder: the GPT-2 124M layout at the defaults.

    ``granularity="module"`` has one op per layer-level operation (about 29
    per block with the backward); ``"aten"`` one per aten kernel as a traced
    training step has them — layer norms, GELU, bias adds, dropout and views
    separately (about 140 per block), for solver scale tests.

    Per block: layer norm, QKV projection, attention scores, softmax, context,
    output projection, residual add, layer norm, MLP (4x, GELU), residual add.
    The output head reuses the token embedding (tied weights), so ``wte.weight``
    has one ``accumulate_grad`` op that sums its two partial gradients.
    """
    if num_layers < 1:
        raise ValueError(f"transformer_like needs num_layers >= 1, got {num_layers}")
    tokens = batch_size * seq_len
    scores = batch_size * num_heads * seq_len * seq_len
    fine = granularity == "aten"
    b = _Builder(tokens, fine=fine)
    wte = b.param("wte.weight", vocab_size, hidden)
    wpe = b.param("wpe.weight", seq_len, hidden)
    b.ops.append(ForwardOp(id="wte", kind="embedding", reads=(wte,), bytes_moved=_F32 * tokens * hidden * 2))
    b.ops.append(ForwardOp(id="wpe", kind="embedding", reads=(wpe,), bytes_moved=_F32 * tokens * hidden * 2))
    x = b.pointwise("embed_add", "add", ("wte", "wpe"), tokens * hidden)
    for i in range(num_layers):
        x = _decoder_block(b, f"h.{i}", x, hidden=hidden, num_heads=num_heads, seq_len=seq_len, tokens=tokens,
                           scores=scores)
    ln_f = b.norm("ln_f", (x,), hidden)
    logits = b.linear("lm_head", (ln_f,), hidden, vocab_size, bias=False, weight=wte)
    b.pointwise("loss", "cross_entropy", (logits,), tokens * vocab_size, flops_per_elem=5.0)
    suffix = "" if granularity == "module" else f".{granularity}"
    return b.build(f"transformer_like{num_layers}{suffix}", device, tokens=tokens, granularity=granularity)


def _decoder_block(b: "_Builder", h: str, x: str, *, hidden: int, num_heads: int, seq_len: int, tokens: int,
                   scores: int) -> str:
    """One GPT-2 block of :func:`transformer_like` on ``x``; its output op."""
    fine = b.fine
    ln1 = b.norm(f"{h}.ln_1", (x,), hidden)
    qkv = b.linear(f"{h}.attn.c_attn", (ln1,), hidden, 3 * hidden)
    if fine:
        q, k, v = (b.view(f"{h}.attn.{n}.heads", (b.view(f"{h}.attn.{n}.split", (qkv,)),)) for n in "qkv")
        s_ = b.pointwise(f"{h}.attn.scores", "bmm", (q, b.view(f"{h}.attn.k_t", (k,))), scores,
                         flops_per_elem=2.0 * hidden / num_heads)
        s_ = b.steps(f"{h}.attn.mask", (s_,), scores, [("div", 1), ("masked_fill", 1)])
        p = b.steps(f"{h}.attn.softmax", (s_,), scores, [("softmax", 5), ("dropout", 2)])
        ctx = b.pointwise(f"{h}.attn.context", "bmm", (p, v), tokens * hidden, flops_per_elem=2.0 * seq_len)
        ctx = b.view(f"{h}.attn.merge_heads", (b.pointwise(f"{h}.attn.transpose", "clone", (ctx,),
                                                           tokens * hidden, flops_per_elem=0.0),))
    else:
        s_ = b.pointwise(f"{h}.attn.scores", "bmm", (qkv,), scores, flops_per_elem=2.0 * hidden / num_heads)
        p = b.pointwise(f"{h}.attn.softmax", "softmax", (s_,), scores, flops_per_elem=5.0)
        ctx = b.pointwise(f"{h}.attn.context", "bmm", (p, qkv), tokens * hidden, flops_per_elem=2.0 * seq_len)
    proj = b.linear(f"{h}.attn.c_proj", (ctx,), hidden, hidden)
    if fine:
        proj = b.pointwise(f"{h}.attn.resid_dropout", "dropout", (proj,), tokens * hidden, flops_per_elem=2.0)
    x = b.pointwise(f"{h}.residual_1", "add", (x, proj), tokens * hidden)
    ln2 = b.norm(f"{h}.ln_2", (x,), hidden)
    fc = b.linear(f"{h}.mlp.c_fc", (ln2,), hidden, 4 * hidden)
    if fine:
        act = b.steps(f"{h}.mlp.gelu", (fc,), tokens * 4 * hidden,
                      [("pow", 1), ("mul", 1), ("add", 1), ("mul", 1), ("tanh", 4), ("add", 1), ("mul", 1),
                       ("mul", 1)])
    else:
        act = b.pointwise(f"{h}.mlp.gelu", "gelu", (fc,), tokens * 4 * hidden, flops_per_elem=8.0)
    out = b.linear(f"{h}.mlp.c_proj", (act,), 4 * hidden, hidden)
    if fine:
        out = b.pointwise(f"{h}.mlp.dropout", "dropout", (out,), tokens * hidden, flops_per_elem=2.0)
    x = b.pointwise(f"{h}.residual_2", "add", (x, out), tokens * hidden)
    return x


#: Generators by name, as the CLI and benchmarks refer to them.
GENERATORS = {
    "chain": chain,
    "diamond": diamond,
    "branches": branches,
    "transformer_like": transformer_like,
}


def main(argv: list[str] | None = None) -> int:
    """Write a synthetic graph: ``python -m schedopt.synthetic transformer_like 12 -o graph.json``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m schedopt.synthetic", description=main.__doc__)
    parser.add_argument("generator", choices=sorted(GENERATORS))
    parser.add_argument("size", nargs="?", type=int, help="layers (chain, transformer_like) or branches")
    parser.add_argument("--device", default="a100")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    make = GENERATORS[args.generator]
    graph = make(device=args.device) if args.size is None else make(args.size, device=args.device)
    graph.save(args.output)
    print(f"{graph.name}: {len(graph.ops)} ops, {len(graph.params)} params -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
