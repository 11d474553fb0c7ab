"""Config of the tiny LLaDA2-MoE stand-in (remote code, see __init__)."""
from transformers import PretrainedConfig


class TinyLLaDAConfig(PretrainedConfig):
    model_type = "tiny_llada"

    def __init__(self, vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, head_dim=8, rope_theta=600000.0, partial_rotary_factor=0.5,
                 rms_norm_eps=1e-6, pad_token_id=151643, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.head_dim = head_dim
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.rms_norm_eps = rms_norm_eps
        super().__init__(pad_token_id=pad_token_id, **kwargs)
