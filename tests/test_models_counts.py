"""Parameter counts on the meta device equal the published values (MODELS.md)."""

import pytest
import torch

from stdlib.models.common import count_parameters
from stdlib.models.deepseek import DeepSeekV3
from stdlib.models.gpt2 import GPT2
from stdlib.models.llama import Llama

PUBLISHED = [
    (Llama, "llama3_8b", 8_030_261_248),
    (Llama, "llama3_70b", 70_553_706_496),
    (Llama, "llama3_405b", 405_853_388_800),
    (DeepSeekV3, "deepseek_v3_16b", 15_706_484_224),
    (DeepSeekV3, "deepseek_v3_236b", 235_741_434_880),
    (DeepSeekV3, "deepseek_v3_671b", 671_026_404_352),
    # Hugging Face's gpt2 has 124,439,808 parameters with the output head tied to the token
    # embedding; ours is untied by default, which adds one more vocab x hidden matrix.
    (GPT2, "gpt2_small", 124_439_808 + 50257 * 768),
    (GPT2, "gpt2_medium", 354_823_168 + 50257 * 1024),
    # Llama 3.2 ties its output head to the token embedding (configs say tie_embeddings)
    (Llama, "llama3_2_1b", 1_235_814_400),
    (Llama, "llama3_2_3b", 3_212_749_824),
]
#: the same models with the head tied by a spec-line setting: the published tied counts
TIED = [(GPT2, "gpt2_small", 124_439_808), (GPT2, "gpt2_medium", 354_823_168)]


def on_meta(cls, name, **overrides):
    with torch.device("meta"):
        return cls.from_config_name(name, **overrides)


@pytest.mark.parametrize(("cls", "name", "expected"), PUBLISHED, ids=[p[1] for p in PUBLISHED])
def test_parameter_count_matches_published(cls, name, expected):
    assert count_parameters(on_meta(cls, name)) == expected


@pytest.mark.parametrize(("cls", "name", "expected"), TIED, ids=[p[1] for p in TIED])
def test_tied_parameter_count_matches_published(cls, name, expected):
    assert count_parameters(on_meta(cls, name, tie_embeddings=True)) == expected


LARGEST = [(Llama, "llama3_405b"), (DeepSeekV3, "deepseek_v3_671b")]


@pytest.mark.parametrize(("cls", "name"), LARGEST)
def test_meta_instantiation_allocates_no_storage(cls, name):
    model = on_meta(cls, name)
    tensors = list(model.parameters()) + list(model.buffers())
    assert tensors and all(tensor.is_meta for tensor in tensors)


def test_deepseek_671b_breakdown():
    """The published count excludes the score-correction bias (a buffer here) and MTP."""
    model = on_meta(DeepSeekV3, "deepseek_v3_671b")
    moe = model.layers[3].feed_forward
    assert tuple(moe.experts.w1.shape) == (256, 2048, 7168)
    assert tuple(moe.experts.w2.shape) == (256, 7168, 2048)
    assert tuple(moe.gate.weight.shape) == (256, 7168)
    assert "layers.3.feed_forward.gate.e_score_correction_bias" in dict(model.named_buffers())
    assert count_parameters(moe.shared_experts) == 3 * 7168 * 2048
    assert count_parameters(model.layers[0].attention) == 187_107_328
