"""The LLaDA2-MoE stand-in: a bidirectional pre-norm transformer with partial rotary positions and
grouped-query attention; dense SiLU-gated MLPs, or from first_k_dense_replace on BailingMoeV2-style
MoE layers when num_experts > 0 (remote code, see __init__)."""
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
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rot = int(config.head_dim * config.partial_rotary_factor)
        inner = self.heads * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, inner + 2 * self.kv_heads * self.head_dim, bias=False)
        self.dense = nn.Linear(inner, config.hidden_size, bias=False)

    def forward(self, x, mask, cos, sin):
        b, n, _ = x.shape
        heads = self.query_key_value(x).view(b, n, self.heads + 2 * self.kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = heads.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        cos, sin = cos[:, None], sin[:, None]

        def rope(t):
            r, rest = t[..., :self.rot], t[..., self.rot:]
            return torch.cat([r * cos + _rotate_half(r) * sin, rest], dim=-1)
        out = F.scaled_dot_product_attention(rope(q), rope(k), v, attn_mask=mask,
                                             enable_gqa=self.kv_heads != self.heads)
        return self.dense(out.transpose(1, 2).reshape(b, n, -1))


class TinyLLaDAMLP(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLLaDAGate(nn.Module):
    """Sigmoid scores; routing = scores + expert_bias; the topk_group groups with the best top-2 sums
    stay; the num_experts_per_tok best experts among them, weighted by their (unbiased) scores
    normalised to sum 1 and scaled by routed_scaling_factor."""

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        self.k, self.groups, self.keep = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor

    def forward(self, h):
        scores = torch.sigmoid(F.linear(h.float(), self.weight.float()))                  # [T, E]
        routing = scores + self.expert_bias.float()
        grouped = routing.view(h.shape[0], self.groups, -1)
        group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)        # [T, G]
        kept = torch.zeros_like(group_score).scatter_(1, group_score.topk(self.keep, dim=-1).indices, 1.0)
        masked = routing.masked_fill(~kept.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        experts = masked.topk(self.k, dim=-1).indices                                       # [T, k]
        weights = scores.gather(1, experts)
        return experts, weights / (weights.sum(-1, keepdim=True) + 1e-20) * self.scale


class TinyLLaDAMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = TinyLLaDAGate(config)
        self.experts = nn.ModuleList(TinyLLaDAMLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.num_experts))
        shared = config.moe_intermediate_size * config.num_shared_experts
        self.shared_experts = TinyLLaDAMLP(config.hidden_size, shared) if shared else None

    def forward(self, h):
        shape = h.shape
        flat = h.reshape(-1, shape[-1])
        experts, weights = self.gate(flat)
        out = torch.zeros_like(flat)
        order = experts.flatten().argsort()                   # the (token, slot) pairs grouped by expert
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts)).tolist()
        tokens = order // experts.shape[1]
        slot_weights = weights.flatten()[order]
        start = 0
        for e, count in enumerate(counts):
            if count:
                rows = tokens[start:start + count]
                y = self.experts[e](flat[rows]) * slot_weights[start:start + count, None].to(flat.dtype)
                out.index_add_(0, rows, y)
                start += count
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape)


class TinyLLaDADecoderLayer(nn.Module):
    def __init__(self, config, index=0):
        super().__init__()
        self.input_layernorm = TinyLLaDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = TinyLLaDAAttention(config)
        self.post_attention_layernorm = TinyLLaDARMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.num_experts and index >= config.first_k_dense_replace:
            self.mlp = TinyLLaDAMoE(config)
        else:                    # the dense layers keep the flat names of the tests' tiny snapshots
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
            self.mlp = None

    def forward(self, x, mask, cos, sin):
        x = x + self.attention(self.input_layernorm(x), mask, cos, sin)
        h = self.post_attention_layernorm(x)
        if self.mlp is not None:
            return x + self.mlp(h)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLLaDAPreTrainedModel(PreTrainedModel):
    config_class = TinyLLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["TinyLLaDADecoderLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding, TinyLLaDAGate)):
            module.weight.data.normal_(0.0, 0.05)


class TinyLLaDAModel(TinyLLaDAPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyLLaDADecoderLayer(config, i) for i in range(config.num_hidden_layers))
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
