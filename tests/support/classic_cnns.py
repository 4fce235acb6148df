"""The nine classic CNNs the onnx package ships as "light" models (real architectures,
every weight a ``ConstantOfShape``): AlexNet, DenseNet-121, Inception v1/v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19, ZFNet-512."""

from __future__ import annotations

from pathlib import Path

import onnx

__all__ = ["CLASSIC_CNNS", "LIGHT_DIR"]

#: ``onnx/backend/test/data/light``: ``light_<name>.onnx`` and its stored outputs.
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

#: Their names (``light_<name>.onnx``).
CLASSIC_CNNS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)
