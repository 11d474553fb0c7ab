"""PixArt: the 4.7B T5-XXL v1.1 encoder → pig_clip + a 120-query resampler seeded with T5 ids.

The worked example of docs/PACKS.md. Per prompt the teacher gives T5's last_hidden_state at
the real slots of the 120-slot PixArt window (the T5 pieces + EOS, padded with 0); the
student reads the raw prompt (no template); the adapter's query i is seeded with the T5
embedding of slot i, so the ids the engine already builds for its mask select the queries.
A declaration of the T5 family (common/t5/).
"""
from __future__ import annotations

from trainer_core.packs.base import EngineFacts
from trainer_core.packs.common.t5 import T5_VOCAB, T5_WIDTH, T5_WINDOW, T5EncoderPack
from trainer_core.packs.eval_guide import EvalGuide

__all__ = ["PACK"]


PACK = T5EncoderPack(
    id="t5xxl_pixart",
    order=70,
    demo_order=1,
    title="PixArt (T5-XXL v1.1 → 120-query seeded resampler)",
    description=(
        "Replaces PixArt's 4.7B T5-XXL v1.1 encoder (--t5xxl) with pig_clip and a 120-query "
        "resampler whose queries are seeded with the T5 sentencepiece embedding of their slot "
        "(the original trainer recipe). The T5 tokenizer stays at inference; the encoder is never "
        "loaded. Targets are T5's last_hidden_state at the real slots (~40 rows × 4096 a prompt)."
    ),
    adapter_kind="seeded_resampler",
    default_folder="t5_adapter",
    shard_contract="t5xxl_pixart/1",
    window=T5_WINDOW,
    max_len_student=256,
    reference_dims={"out_dim": T5_WIDTH, "num_queries": T5_WINDOW, "seed_vocab": T5_VOCAB},  # ~40 slots are real
    metric_names=("cos", "cos_rms", "rel_mse", "worst_row_cos", "cos_eos", "roundtrip_cos",
                  "trained_steps", "val_batches"),
    engine=EngineFacts(versions=("pixart",)),
    ggk_model_args="--diffusion-model pixart-nvfp4.gguf --vae pig_pixart_vae_fp16-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf}",
    judge=EvalGuide(
        headline="cos", also=("rel_mse", "cos_eos"),
        good="runs plateau at 0.80–0.83 (the 0.6B student is the ceiling); the per-position mean scores ~0.455 and "
             "below ~0.6 the seed or tokenizer path is broken; cos_eos is ~0.99 once the seed works",
        references=(("cos", "0.80–0.83"),),
        source="gguf-trainer 0.0.14's pack hint (the published package, PyPI): "
               "the reference run reached val cos 0.827 at 12.5k steps on "
               "117k prompts and both reference runs flattened at 0.80–0.83 (val cos: raw cosine over the real "
               "slots, what eval.json's cos measures); the ~0.6 and cos_eos figures are from the same pack hint"),
)
