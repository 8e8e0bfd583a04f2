"""The synthetic Gemma-4's weights: vLLM's dummy loader (every state-dict entry uniform in ±1e-3)
makes activations vanish with depth; `hf_like_init` rewrites them the way transformers
initialises a fresh Gemma-4, on transformers' modules and on modules named like vLLM's."""

import json

import pytest
import torch
from torch import nn

from alignatt.models.synthetic_init import HFLikeInit, hf_like_init, init_rule, tensor_seed

SMALL = {"hidden_size": 64, "intermediate_size": 128, "hidden_size_per_layer_input": 8,
         "vocab_size": 512, "vocab_size_per_layer_input": 512}


def gemma4(layers: int = 42, seed: int = 0):
    """A transformers Gemma-4 with E4B's layer plan (sliding/full, KV-shared tail), small widths."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    from alignatt.models.presets import e4b_config_path

    fields = json.loads(e4b_config_path().read_text())
    for key in ("architectures", "model_type"):
        fields.pop(key)
    shared = fields["num_kv_shared_layers"] * layers // fields["num_hidden_layers"]
    fields.update(num_hidden_layers=layers, layer_types=fields["layer_types"][:layers],
                  num_kv_shared_layers=shared, **SMALL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Gemma4ForCausalLM(Gemma4TextConfig(**fields)).eval()


@torch.no_grad()
def dummy_load(model: nn.Module) -> None:
    """What vLLM's `initialize_dummy_weights` does: every floating state-dict tensor in ±1e-3."""
    for t in model.state_dict().values():
        if torch.is_floating_point(t):
            t.uniform_(-1e-3, 1e-3)


def test_matches_transformers_fresh_init_tensor_by_tensor():
    fresh = gemma4(layers=12)
    model = gemma4(layers=12, seed=1)
    dummy_load(model)
    summary = hf_like_init(model, HFLikeInit(std=fresh.config.initializer_range, seed=3), pad_token_id=0)
    assert summary["pad_rows_zeroed"] == ["model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"]
    ours = model.state_dict()
    for name, want in fresh.state_dict().items():
        got = ours[name].float()
        want = want.float()
        if want.numel() == 1 or bool((want == want.flatten()[0]).all()):  # a constant: norms, layer_scalar
            assert torch.equal(got, want), name
            continue
        zero_rows = (want == 0).all(-1)
        assert torch.equal((got == 0).all(-1), zero_rows), name  # the padding rows, nothing else
        live = got[~zero_rows]
        assert abs(live.std().item() / want[~zero_rows].std().item() - 1) < 0.15, name
        assert abs(live.mean().item()) < 0.01, name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, written once


def test_dummy_weights_vanish_with_depth_and_hf_like_weights_do_not():
    ids = torch.tensor([[2, 17, 301, 44, 5, 99, 123, 7]])
    other = torch.tensor([[2, 400, 8, 250, 31, 77, 12, 210]])
    model = gemma4(layers=42)
    dummy_load(model)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    last = out.hidden_states[-2]  # before the final norm
    assert last.abs().max().item() < 1e-30, "the dummy model's deep activations should vanish"
    assert (out.logits[0].argmax(-1) == 0).all()  # every position ties: greedy picks <pad>

    hf_like_init(model, HFLikeInit(), pad_token_id=0)
    with torch.no_grad():
        a = model(input_ids=ids, output_hidden_states=True)
        b = model(input_ids=other)
    rms = a.hidden_states[-2].float().pow(2).mean().sqrt().item()
    assert 0.5 < rms < 100, rms
    tokens = a.logits[0].argmax(-1).tolist() + b.logits[0].argmax(-1).tolist()
    assert 0 not in tokens and len(set(tokens)) >= 8, tokens  # varied, never the pad token


# ---- modules named like vLLM's (the rule keys on class names, not on transformers) ----


class RMSNorm(nn.Module):
    def __init__(self, dim: int, has_weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim)) if has_weight else torch.ones(dim)  # vLLM: plain attr


class QKVParallelLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(48, 16))


class RowParallelLinear(QKVParallelLinear):
    pass


class VocabParallelEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(64, 16))


class ParallelLMHead(VocabParallelEmbedding):
    def tie(self, embed):
        self.weight = embed.weight
        return self


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
            self.register_buffer(name, torch.tensor(0.0005))


class CapturingAttention(Attention):  # what vllm_capture swaps in: keeps its base's rule
    pass


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj, self.o_proj = QKVParallelLinear(), RowParallelLinear()
        self.q_norm, self.v_norm = RMSNorm(16), RMSNorm(16, has_weight=False)
        self.attn = CapturingAttention()
        self.register_buffer("layer_scalar", torch.full((1,), 0.0007))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding()
        self.layers = nn.ModuleList([DecoderLayer(), DecoderLayer()])
        self.norm = RMSNorm(16)
        self.register_buffer("normalizer", torch.tensor(4.0), persistent=False)
        self.lm_head = ParallelLMHead().tie(self.embed_tokens)


def vllm_like() -> Model:
    model = Model()
    dummy_load(model)
    return model


def test_vllm_named_modules_get_the_same_rules():
    model = vllm_like()
    summary = hf_like_init(model, HFLikeInit(std=0.02, seed=0), pad_token_id=0)
    for layer in model.layers:
        assert torch.equal(layer.layer_scalar, torch.ones(1))
        assert torch.equal(layer.q_norm.weight.data, torch.ones(16))
        assert torch.equal(layer.v_norm.weight, torch.ones(16))  # not in the state dict: untouched
        assert layer.attn._k_scale.item() == 1.0 and layer.attn._prob_scale.item() == 1.0
        assert 0.015 < layer.qkv_proj.weight.std().item() < 0.025
    assert model.normalizer.item() == 4.0  # a non-persistent buffer: the dummy loader never saw it
    assert (model.embed_tokens.weight[0] == 0).all() and (model.embed_tokens.weight[1:] != 0).all()
    assert model.lm_head.weight is model.embed_tokens.weight
    assert summary["pad_rows_zeroed"] == ["embed_tokens.weight"]
    assert summary["tensors"]["normal"] == 5  # embed (tied lm_head once) + 2 x (qkv, o)
    assert init_rule(type("GemmaRMSNorm", (nn.Module,), {})(), "weight") == "zeros"


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = vllm_like(), vllm_like(), vllm_like()
    hf_like_init(a, HFLikeInit(seed=5))
    hf_like_init(b, HFLikeInit(seed=5))
    hf_like_init(c, HFLikeInit(seed=6))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.layers[0].qkv_proj.weight, c.layers[0].qkv_proj.weight)
    assert not torch.equal(a.layers[0].qkv_proj.weight, a.layers[1].qkv_proj.weight)  # per-tensor seeds
    assert tensor_seed(5, "x") != tensor_seed(5, "y")


def test_an_entry_without_a_rule_is_refused_by_name():
    model = vllm_like()
    model.layers[1].register_parameter("mystery", nn.Parameter(torch.zeros(3)))
    with pytest.raises(RuntimeError, match=r"layers\.1\.mystery"):
        hf_like_init(model, HFLikeInit())
    # the engine path does not stop for it: it is listed, and the rest is initialised
    summary = hf_like_init(model, HFLikeInit(), strict=False)
    assert summary["unknown"] == ["layers.1.mystery (DecoderLayer)"]
    assert torch.equal(model.layers[1].layer_scalar, torch.ones(1))


def fp8_linear(out_features: int = 48, in_features: int = 32) -> nn.Module:
    """A linear layer as vLLM's online FP8 leaves it: the weight in FP8, stored transposed (a view
    of the quantized tensor), and one float32 scale for the tensor."""
    layer = type("QKVParallelLinear", (nn.Module,), {})()
    quantized = torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn)
    layer.weight = nn.Parameter(quantized.t(), requires_grad=False)
    layer.weight_scale = nn.Parameter(torch.full((1,), 1e-3), requires_grad=False)
    return layer


def test_fp8_weights_are_drawn_like_bf16_ones_and_stored_with_their_scale():
    model = nn.Module()
    model.proj = fp8_linear()
    summary = hf_like_init(model, HFLikeInit(std=0.02, seed=0))
    weight, scale = model.proj.weight, model.proj.weight_scale
    assert weight.dtype == torch.float8_e4m3fn and summary["fp8_weights"] == 1 and not summary["unknown"]
    dequantized = weight.float() * scale
    assert 0.015 < dequantized.std().item() < 0.025
    # the largest draw lands on the format's largest value: the scale is the tensor's own
    assert weight.float().abs().max().item() == torch.finfo(torch.float8_e4m3fn).max
    assert scale.item() == pytest.approx(dequantized.abs().max().item() / 448.0)
    again = nn.Module()
    again.proj = fp8_linear()
    hf_like_init(again, HFLikeInit(std=0.02, seed=0))
    assert torch.equal(again.proj.weight.float(), weight.float())  # seeded per tensor, like the rest


def test_a_weight_scale_without_an_fp8_weight_has_no_rule():
    layer = type("RowParallelLinear", (nn.Module,), {})()
    layer.weight = nn.Parameter(torch.zeros(4, 4))
    layer.weight_scale = nn.Parameter(torch.ones(1))
    assert init_rule(layer, "weight_scale") is None
    assert init_rule(fp8_linear(), "weight_scale") == "scale"
