"""Make the tiny exported models the vision tests load (needs torch; run by hand):

    python tests/vision_models/make.py

Two small networks with the patterns torch.onnx writes for real vision models, random
weights from fixed seeds, a dynamic batch axis, TorchScript exporter (``dynamo=False``):

* ``tiny_mobilenet.onnx`` (opset 17): Conv+BatchNorm (folded by the exporter) + ReLU6
  (Clip), a depthwise 3x3 stride-2 conv, an inverted residual (residual Add), HardSwish,
  a squeeze-excite block (GlobalAveragePool, Conv, SiLU, Conv, Sigmoid, Mul) and a
  classifier.
* ``tiny_vit_op17.onnx`` / ``tiny_vit_op14.onnx``: a patch embedding and one pre-norm
  transformer block (multi-head attention with q @ k^T, softmax, exact GELU MLP); opset 17
  writes LayerNormalization, opset 14 the decomposed ReduceMean/Sub/Pow/Sqrt/Div pattern.

The files are a few tens of KB; commit them with the script.
"""

from __future__ import annotations

import os

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


class TinyMobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU6())  # fmt: skip
        self.expand = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
                                    nn.ReLU6())  # fmt: skip
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False),
                                nn.BatchNorm2d(16), nn.Hardswish())  # fmt: skip
        self.se1 = nn.Conv2d(16, 4, 1)
        self.se2 = nn.Conv2d(4, 16, 1)
        self.project = nn.Sequential(nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.down = nn.Sequential(nn.Conv2d(8, 8, 5, 2, 2, groups=8), nn.SiLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.dw(self.expand(x))
        s = torch.sigmoid(self.se2(nn.functional.silu(self.se1(y.mean((2, 3), keepdim=True)))))
        x = x + self.project(y * s)
        x = self.down(x)
        return self.head(x.mean((2, 3)))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.heads = heads
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, C)
        b, n, c = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        h = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(h)
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))
        return self.head(x.mean(1))


def export(model: nn.Module, name: str, opset: int) -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 3, 16, 16)
    path = os.path.join(HERE, name)
    torch.onnx.export(
        model.eval(), (x,), path, dynamo=False, opset_version=opset,
        input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
    )  # fmt: skip
    print(f"{path}: {os.path.getsize(path):,} bytes")


def main() -> None:
    torch.manual_seed(0)
    mobile = TinyMobileNet()
    for m in mobile.modules():  # non-trivial BatchNorm statistics, so the fold matters
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # tracked stats
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    export(mobile, "tiny_mobilenet.onnx", 17)
    torch.manual_seed(0)
    vit = TinyViT()
    export(vit, "tiny_vit_op17.onnx", 17)
    export(vit, "tiny_vit_op14.onnx", 14)


if __name__ == "__main__":
    main()
