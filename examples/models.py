"""Example models, written here (torchvision does not import beside torch 2.13).

Each factory returns ``(model, example_inputs)`` or ``(model, example_inputs,
loss_fn)``, the form ``schedopt import examples/models.py:resnet50`` and
``from_torch`` take. Full-size models match the published layouts exactly:

=================  ===========  ==========================================
factory            parameters   layout
=================  ===========  ==========================================
``resnet50``       25,557,032   ResNet-50 (torchvision), 224x224 input
``vgg16``          138,357,544  VGG-16 (torchvision, no batch norm)
``inception``      23,834,568   Inception-v3 without the auxiliary head
``gpt2_small``     124,439,808  GPT-2 124M, output head tied to ``wte``
``bert_base``      109,514,298  BERT-base with the masked-LM head (tied decoder)
``resnet18``       11,173,962   ResNet-18 for CIFAR (3x3 stem, no max-pool), 32x32 input
``gpt_tied``       5,322,240    GPT-2-style, 4 layers, d=256, vocabulary 8,192, tied head
``gpt_deep``       8,481,280    ``gpt_tied`` with 8 layers (sharded training on the testbed)
=================  ===========  ==========================================

``resnet18`` and ``gpt_tied`` are sized for the two-rank CPU testbed
(``bench/testbed.py``): a step takes 0.5-0.6 s on one thread here (measured).

The ``tiny_*`` factories keep the same structure at toy sizes for tests.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "resnet50", "vgg16", "inception", "gpt2_small", "bert_base", "resnet18", "gpt_tied", "gpt_deep",
    "digits_cnn", "tiny_cnn", "tiny_resnet", "tiny_vgg", "tiny_inception", "tiny_gpt", "tiny_bert", "tiny_branches",
    "FACTORIES",
]

# ----------------------------------------------------------------------------- ResNet


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * self.expansion:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * self.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * self.expansion),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...], *, width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = width
        stages = []
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(inplanes, planes, stride=2 if (b == 0 and i > 0) else 1))
                inplanes = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _classification(model: nn.Module, x: torch.Tensor, num_classes: int):
    target = torch.arange(x.shape[0]) % num_classes

    def loss_fn(logits: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target.to(logits.device))  # the labels go where the model went

    return model, (x,), loss_fn


def resnet50(batch_size: int = 32):
    """ResNet-50, 224x224 images, cross-entropy loss."""
    return _classification(ResNet((3, 4, 6, 3)), torch.randn(batch_size, 3, 224, 224), 1000)


def tiny_resnet(batch_size: int = 2):
    """A ResNet with one bottleneck per stage, width 8, 32x32 images."""
    return _classification(ResNet((1, 1, 1, 1), width=8, num_classes=10), torch.randn(batch_size, 3, 32, 32), 10)


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class CifarResNet18(nn.Module):
    """ResNet-18 for 32x32 images: a 3x3 stem without max-pool, four stages of two basic blocks."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        stages, inplanes = [], 64
        for i, planes in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(batch_size: int = 16):
    """ResNet-18 on CIFAR-size (32x32) images, 10 classes, cross-entropy loss."""
    return _classification(CifarResNet18(), torch.randn(batch_size, 3, 32, 32), 10)


# ----------------------------------------------------------------------------- VGG


class VGG(nn.Module):
    def __init__(self, cfg: tuple, *, hidden: int = 4096, pool: int = 7, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(pool)
        self.classifier = nn.Sequential(
            nn.Linear(channels * pool * pool, hidden), nn.ReLU(True), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(batch_size: int = 32):
    """VGG-16 (configuration D), 224x224 images."""
    return _classification(VGG(_VGG16), torch.randn(batch_size, 3, 224, 224), 1000)


def tiny_vgg(batch_size: int = 2):
    """A five-conv VGG at 32x32."""
    return _classification(VGG((8, "M", 16, "M", 16, 16, "M"), hidden=32, pool=2, num_classes=10),
                           torch.randn(batch_size, 3, 32, 32), 10)


# ----------------------------------------------------------------------------- Inception-v3


class BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size, stride=1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(self.branch7x7dbl_3(self.branch7x7dbl_2(bd))))
        bp = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([b3, b7, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, stride=2)
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


class TinyInception(nn.Module):
    """A stem, one InceptionA-style block of four branches, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = BasicConv2d(3, 16, 3, stride=2)
        self.branch1x1 = BasicConv2d(16, 8, 1)
        self.branch3x3_1 = BasicConv2d(16, 8, 1)
        self.branch3x3_2 = BasicConv2d(8, 12, 3, padding=1)
        self.branch5x5_1 = BasicConv2d(16, 4, 1)
        self.branch5x5_2 = BasicConv2d(4, 8, 5, padding=2)
        self.branch_pool = BasicConv2d(16, 4, 1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b = [self.branch1x1(x), self.branch3x3_2(self.branch3x3_1(x)), self.branch5x5_2(self.branch5x5_1(x)),
             self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))]
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(torch.cat(b, 1), 1), 1))


def inception(batch_size: int = 32):
    """Inception-v3 without the auxiliary classifier, 299x299 images."""
    return _classification(InceptionV3(), torch.randn(batch_size, 3, 299, 299), 1000)


def tiny_inception(batch_size: int = 2):
    return _classification(TinyInception(), torch.randn(batch_size, 3, 32, 32), 10)


# ----------------------------------------------------------------------------- transformers


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, max_len: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.num_heads, c // self.num_heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.num_heads))
        future = torch.ones_like(scores, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, hidden: int, num_heads: int, max_len: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, num_heads, max_len)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential()
        self.mlp.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp.act = nn.GELU(approximate="tanh")
        self.mlp.c_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: learned positions, pre-norm blocks, output head tied to the token embedding."""

    def __init__(self, *, vocab: int, max_len: int, hidden: int, num_layers: int, num_heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_len, hidden)
        self.h = nn.ModuleList([GPTBlock(hidden, num_heads, max_len) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(hidden)
        for m in self.modules():  # GPT-2's initialization: with torch's N(0, 1) embedding the tied
            if isinstance(m, (nn.Linear, nn.Embedding)):  # head's logits start near +-16 (loss ~30)
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's logits against the next token."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _language_model(model: nn.Module, idx: torch.Tensor, vocab: int):
    return model, (idx,), next_token_loss


def gpt2_small(batch_size: int = 8, seq_len: int = 1024):
    """GPT-2 124M: 12 layers, 768 wide, 12 heads, 50257 tokens, context 1024."""
    model = GPT(vocab=50257, max_len=1024, hidden=768, num_layers=12, num_heads=12)
    return _language_model(model, torch.randint(0, 50257, (batch_size, seq_len)), 50257)


def gpt_tied(batch_size: int = 8, seq_len: int = 128):
    """A GPT-2-style model for the testbed: 4 layers, 256 wide, 4 heads, 8,192 tokens, tied head."""
    model = GPT(vocab=8192, max_len=256, hidden=256, num_layers=4, num_heads=4)
    return _language_model(model, torch.randint(0, 8192, (batch_size, seq_len)), 8192)


def gpt_deep(batch_size: int = 8, seq_len: int = 128):
    """gpt_tied twice as deep, for sharded training on the testbed: 8 layers, 256 wide, 4 heads, tied head."""
    model = GPT(vocab=8192, max_len=256, hidden=256, num_layers=8, num_heads=4)
    return _language_model(model, torch.randint(0, 8192, (batch_size, seq_len)), 8192)


def tiny_gpt(batch_size: int = 2, seq_len: int = 16):
    model = GPT(vocab=128, max_len=32, hidden=32, num_layers=2, num_heads=4)
    return _language_model(model, torch.randint(0, 128, (batch_size, seq_len)), 128)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, num_heads: int, intermediate: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = [z.view(b, t, self.num_heads, c // self.num_heads).transpose(1, 2)
                 for z in (self.query(x), self.key(x), self.value(x))]
        q, k, v = heads
        attn = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.num_heads)), dim=-1) @ v
        x = self.attention_norm(x + self.attention_output(attn.transpose(1, 2).reshape(b, t, c)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertMLM(nn.Module):
    """BERT encoder with the masked-LM head; the decoder is tied to the word embedding."""

    def __init__(self, *, vocab: int, max_len: int, hidden: int, num_layers: int, num_heads: int,
                 intermediate: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_len, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(hidden, num_heads, intermediate) for _ in range(num_layers)])
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.word_embeddings(idx) + self.position_embeddings(positions)
        x = self.embedding_norm(x + self.token_type_embeddings(torch.zeros_like(idx)))
        for layer in self.layers:
            x = layer(x)
        x = self.transform_norm(F.gelu(self.transform(x)))
        return F.linear(x, self.word_embeddings.weight, self.decoder_bias)


def _masked_lm(model: nn.Module, idx: torch.Tensor, vocab: int):
    def loss_fn(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, vocab), tokens.reshape(-1))

    return model, (idx,), loss_fn


def bert_base(batch_size: int = 32, seq_len: int = 128):
    """BERT-base: 12 layers, 768 wide, 12 heads, 30522 tokens, masked-LM head."""
    model = BertMLM(vocab=30522, max_len=512, hidden=768, num_layers=12, num_heads=12, intermediate=3072)
    return _masked_lm(model, torch.randint(0, 30522, (batch_size, seq_len)), 30522)


def tiny_bert(batch_size: int = 2, seq_len: int = 16):
    model = BertMLM(vocab=96, max_len=32, hidden=32, num_layers=2, num_heads=4, intermediate=64)
    return _masked_lm(model, torch.randint(0, 96, (batch_size, seq_len)), 96)


# ----------------------------------------------------------------------------- small CNNs


class DigitsCNN(nn.Module):
    """Two conv-bn-relu layers, a max-pool and a two-layer head, for scikit-learn's 8x8 digits."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def digits_cnn(batch_size: int = 32):
    """:class:`DigitsCNN` on 8x8 one-channel images, 10 classes (``bench/osp_accuracy.py`` trains it)."""
    return _classification(DigitsCNN(), torch.randn(batch_size, 1, 8, 8), 10)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def tiny_cnn(batch_size: int = 4):
    """Two conv-bn-relu layers and a linear head on 16x16 images."""
    return _classification(TinyCNN(), torch.randn(batch_size, 3, 16, 16), 10)


class TinyBranches(nn.Module):
    """A stem feeding two branches of different depth that are added back together."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.left = nn.Linear(32, 32)
        self.right1 = nn.Linear(32, 64)
        self.right2 = nn.Linear(64, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(self.left(h) + self.right2(torch.relu(self.right1(h))))


def tiny_branches(batch_size: int = 8):
    return TinyBranches(), (torch.randn(batch_size, 16),)


FACTORIES: dict[str, Callable] = {name: globals()[name] for name in __all__ if name != "FACTORIES"}
