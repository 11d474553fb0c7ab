"""Config of the LLaDA2-MoE stand-in (remote code, see __init__). Dense by default (the tests' tiny
teacher); with num_experts > 0 the layers from first_k_dense_replace on are BailingMoeV2-style MoE
layers (sigmoid group-limited routing, shared experts), so the benchmark can build it at the real
config's size."""
from transformers import PretrainedConfig


class TinyLLaDAConfig(PretrainedConfig):
    model_type = "tiny_llada"

    def __init__(self, vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, head_dim=8, rope_theta=600000.0, partial_rotary_factor=0.5,
                 rms_norm_eps=1e-6, pad_token_id=151643, num_key_value_heads=None, num_experts=0,
                 num_experts_per_tok=0, moe_intermediate_size=0, num_shared_experts=0, first_k_dense_replace=0,
                 n_group=1, topk_group=1, routed_scaling_factor=1.0, **kwargs):
        given = locals()
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "head_dim", "rope_theta", "partial_rotary_factor", "rms_norm_eps", "num_experts",
                     "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts", "first_k_dense_replace",
                     "n_group", "topk_group", "routed_scaling_factor"):
            setattr(self, name, given[name])
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        super().__init__(pad_token_id=pad_token_id, **kwargs)
