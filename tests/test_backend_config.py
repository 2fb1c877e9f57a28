import json

import pytest

from backend.config import PRESETS, ConfigError, ModelConfig, preset_path


def test_presets_have_real_shapes():
    assert set(PRESETS) >= {"deepseek-coder-1.3b", "deepseek-coder-6.7b", "deepseek-coder-33b", "tiny"}
    c = ModelConfig.from_preset("deepseek-coder-33b")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (62, 7168, 56, 8)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta) == (19200, 32256, 100000.0)
    assert (c.rope_scaling_factor, c.max_position_embeddings, c.tie_word_embeddings) == (4.0, 16384, False)
    assert c.num_queries_per_kv == 7 and c.head_dim == 128
    assert 33.0e9 < c.num_params() < 33.7e9
    assert 1.3e9 < ModelConfig.from_preset("deepseek-coder-1.3b").num_params() < 1.4e9
    assert 6.6e9 < ModelConfig.from_preset("deepseek-coder-6.7b").num_params() < 6.9e9
    tiny = ModelConfig.from_preset("tiny")
    assert tiny.num_queries_per_kv > 1 and tiny.vocab_size >= 256 + 2


def test_presets_are_plain_json_files():
    d = json.loads(preset_path("deepseek-coder-33b").read_text())
    assert d["architectures"] == ["LlamaForCausalLM"]


def test_transformers5_rope_parameters_and_missing_architectures():
    d = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
         "num_hidden_layers": 1, "num_attention_heads": 2,
         "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}}
    c = ModelConfig.from_hf_dict(d)
    assert (c.rope_scaling_factor, c.rope_theta, c.num_key_value_heads, c.head_dim) == (4.0, 500.0, 2, 4)


@pytest.mark.parametrize("patch,msg", [
    ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture 'MistralForCausalLM'"),
    ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "unsupported rope_scaling type 'yarn'"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"hidden_act": "gelu"}, "unsupported hidden_act"),
])
def test_bad_configs(patch, msg):
    d = json.loads(preset_path("tiny").read_text())
    d.update(patch)
    with pytest.raises(ConfigError, match=msg):
        ModelConfig.from_hf_dict(d)


def test_missing_field_and_file(tmp_path):
    d = json.loads(preset_path("tiny").read_text())
    del d["hidden_size"]
    with pytest.raises(ConfigError, match="lacks required field 'hidden_size'"):
        ModelConfig.from_hf_dict(d)
    with pytest.raises(ConfigError, match="missing file"):
        ModelConfig.from_json_file(tmp_path / "config.json")
    with pytest.raises(ConfigError, match="unknown preset"):
        ModelConfig.from_preset("nope")
