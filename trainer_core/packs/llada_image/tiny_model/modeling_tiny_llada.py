"""The tiny LLaDA2-MoE stand-in: a bidirectional pre-norm transformer with partial rotary
positions (remote code, see __init__)."""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from trainer_core.packs.llada_image.tiny_model.configuration_tiny_llada import TinyLLaDAConfig


class TinyLLaDARMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class TinyLLaDARotaryEmbedding(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.config = config
        self.rope_type = "default"
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.float().to(x.device)     # [B, N, rot/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class TinyLLaDAAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.rot = int(config.head_dim * config.partial_rotary_factor)
        inner = self.heads * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, 3 * inner, bias=False)
        self.dense = nn.Linear(inner, config.hidden_size, bias=False)

    def forward(self, x, mask, cos, sin):
        b, n, _ = x.shape
        q, k, v = self.query_key_value(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = cos[:, None], sin[:, None]

        def rope(t):
            r, rest = t[..., :self.rot], t[..., self.rot:]
            return torch.cat([r * cos + _rotate_half(r) * sin, rest], dim=-1)
        out = F.scaled_dot_product_attention(rope(q), rope(k), v, attn_mask=mask)
        return self.dense(out.transpose(1, 2).reshape(b, n, -1))


class TinyLLaDADecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = TinyLLaDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = TinyLLaDAAttention(config)
        self.post_attention_layernorm = TinyLLaDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x, mask, cos, sin):
        x = x + self.attention(self.input_layernorm(x), mask, cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLLaDAPreTrainedModel(PreTrainedModel):
    config_class = TinyLLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["TinyLLaDADecoderLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.05)


class TinyLLaDAModel(TinyLLaDAPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyLLaDADecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = TinyLLaDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = TinyLLaDARotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None,
                return_dict=True, **kwargs):
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        b, n, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(n, device=x.device)[None].expand(b, n)
        if attention_mask is not None and attention_mask.dim() == 2:   # key padding only, bidirectional
            keep = attention_mask.bool()[:, None, None, :]
            attention_mask = torch.zeros(b, 1, n, n, dtype=x.dtype, device=x.device).masked_fill(
                ~keep, torch.finfo(x.dtype).min)
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask, cos, sin)
        x = self.norm(x)
        return BaseModelOutput(last_hidden_state=x) if return_dict else (x,)


class TinyLLaDAForEncoding(TinyLLaDAPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyLLaDAModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def set_input_embeddings(self, value):
        self.model.word_embeddings = value

    def forward(self, **kwargs):
        return self.model(**kwargs)
