"""``Model.warmup_generation`` (``generation/warm.py``): on the native tier under
``auto``, the boxes of dims a generation's steps cross are compiled before the first
generation (the hot rule would leave its first steps to the interpreter), and that
generation's tokens are the interpreter's; bad arguments and non-decoders are refused."""

from __future__ import annotations

import pytest

import tfrt_py
from tests.support.models import build
from tests.support.models.decoder import decoder
from tfrt_py.errors import InputError

PROMPT = [3, 14, 15, 9]


@pytest.mark.compiles
def test_warmup_generation_compiles_the_boxes_a_generation_crosses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    onnx_bytes = decoder(layers=1, kv_heads=2).SerializeToString()
    model = tfrt_py.load(onnx_bytes)
    tier = model.native
    assert tier is not None and tier.form == "signature" and not tier.sigs
    assert model.warmup_generation(prompts=(4,), pasts=(6,), batches=(1, 2)) > 0
    # the prompt's box and the one-token step's box, at batch 1 and at 2..16
    assert len(tier.sigs) == 4 and {j.state for j in tier.sigs.values()} == {"ready"}
    assert len(tier.choices) == 4  # the measured choice was made in the warm-up
    want = tfrt_py.load(onnx_bytes, executor="sync").generate(PROMPT, max_new_tokens=3)
    assert model.generate(PROMPT, max_new_tokens=3).tolist() == want.tolist()
    assert len(tier.sigs) == 4  # that generation started no compile


def test_warmup_generation_refuses_bad_arguments_and_other_models() -> None:
    model = tfrt_py.load(decoder(layers=1), executor="sync")
    with pytest.raises(ValueError, match=">= 1"):
        model.warmup_generation(pasts=(0,))
    with pytest.raises(InputError, match="not a KV-cache decoder"):
        tfrt_py.load(build("mlp").model).warmup_generation()
    assert "warmup:" not in model.describe()  # nothing ran
