"""Attention layout: per-layer geometry read from HF configs (Gemma-4 E4B / tiny, Gemma-3)."""

import pytest

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from alignatt.core.layout import AttentionLayout
from alignatt.models.presets import e4b_config_path


@pytest.fixture(scope="module")
def e4b_layout():
    from transformers import AutoConfig

    return AttentionLayout.from_config(AutoConfig.from_pretrained(e4b_config_path().parent))


def test_e4b_kv_shared_layers_read_the_last_unshared_layer_of_their_kind(e4b_layout):
    assert e4b_layout.n_layers == 42
    for la in e4b_layout.layers[:24]:
        assert la.kv_source_layer == la.layer and not la.kv_shared
    for la in e4b_layout.layers[24:]:
        assert la.kv_shared
        assert la.kv_source_layer == (22 if la.kind == "sliding" else 23)
        assert e4b_layout[la.kv_source_layer].kind == la.kind


def test_e4b_head_geometry(e4b_layout):
    kinds = {la.kind for la in e4b_layout.layers}
    assert kinds == {"sliding", "full"}
    for la in e4b_layout.layers:
        assert (la.n_heads, la.n_kv_heads, la.scaling, la.softcap) == (8, 2, 1.0, None)
        if la.kind == "sliding":
            assert (la.head_dim, la.sliding_window) == (256, 512)
        else:
            assert (la.head_dim, la.sliding_window) == (512, None)
    assert [la.layer for la in e4b_layout.layers if la.kind == "full"] == [5, 11, 17, 23, 29, 35, 41]


def test_gqa_map(e4b_layout):
    la = e4b_layout[0]
    assert [la.kv_head(h) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_gemma3_270m_layout_from_its_config():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=512, hidden_size=640, intermediate_size=2048,
        vocab_size=1024,
    )
    layout = AttentionLayout.from_config(config)
    assert layout.family == "gemma3_text"
    assert [la.layer for la in layout.layers if la.kind == "full"] == [5, 11, 17]
    la = layout[0]
    assert la.scaling == pytest.approx(256**-0.5)
    assert (la.n_heads, la.n_kv_heads, la.head_dim, la.sliding_window) == (4, 1, 256, 512)
    assert [la.kv_head(h) for h in range(4)] == [0, 0, 0, 0]
    assert all(not la.kv_shared for la in layout.layers)


def test_layout_matches_the_instantiated_tiny_model(tiny_gemma4):
    """The layout is derived from the config; the modules are the ground truth."""
    layout = tiny_gemma4.layout
    kinds = {(la.kind, la.kv_shared) for la in layout.layers}
    assert kinds == {("sliding", False), ("full", False), ("sliding", True), ("full", True)}
    assert {la.head_dim for la in layout.layers} == {16, 32}
    for layer, la in zip(tiny_gemma4.model.model.layers, layout.layers):
        attn = layer.self_attn
        assert attn.head_dim == la.head_dim
        assert attn.scaling == la.scaling
        assert attn.sliding_window == la.sliding_window
        assert attn.is_kv_shared_layer == la.kv_shared
        assert attn.num_key_value_groups == la.n_heads // la.n_kv_heads
        assert attn.q_proj.out_features == la.n_heads * la.head_dim
        if not la.kv_shared:
            assert attn.k_proj.out_features == la.n_kv_heads * la.head_dim
        else:  # the donor stores its full-length keys for the shared layers
            assert tiny_gemma4.model.model.layers[la.kv_source_layer].self_attn.store_full_length_kv


@pytest.mark.slow
def test_layout_matches_the_embedded_gemma3(gemma3_270m):
    for layer, la in zip(gemma3_270m.model.model.layers, gemma3_270m.layout.layers):
        attn = layer.self_attn
        assert (attn.head_dim, attn.scaling, attn.sliding_window) == (la.head_dim, la.scaling, la.sliding_window)
        assert attn.num_key_value_groups == la.n_heads // la.n_kv_heads


def test_validate_heads_names_the_valid_range(tiny_gemma4):
    layout = tiny_gemma4.layout
    assert layout.validate_heads([Head(0, 0), Head(7, 3)]) == [Head(0, 0), Head(7, 3)]
    with pytest.raises(AlignattError, match=r"layers 0\.\.7"):
        layout.validate_heads([Head(8, 0)])
    with pytest.raises(AlignattError, match=r"heads 0\.\.3"):
        layout.validate_heads([Head(2, 4)])
    with pytest.raises(AlignattError, match=r"layers 0\.\.7"):
        layout.validate_heads([Head(-1, 0)])
    with pytest.raises(AlignattError, match="no alignment heads"):
        layout.validate_heads([])
    assert len(layout.all_heads()) == 8 * 4


def test_unsupported_model_family_is_a_clear_error():
    from transformers import LlamaConfig

    with pytest.raises(AlignattError, match="no attention layout for model type 'llama'"):
        AttentionLayout.from_config(LlamaConfig(num_hidden_layers=2))
