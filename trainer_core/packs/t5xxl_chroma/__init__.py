"""Chroma (Chroma1-HD and its kin): the 4.7B T5-XXL v1.1 encoder → pig_clip + a 512-query resampler seeded
with T5 ids.

ggk 0.9.7 gives Chroma DiTs its T5CLIPEmbedder, which takes `--llm pig_clip --llm-adapter X` in place of T5
(conditioning/conditioner.hpp:1193-1506; engine-adapter-families §1.5). A declaration of the T5 family
(common/t5/) with the engine's rules for Chroma:

* the window (1371-1395, 1427-1435) is PixArt's rule at 512 slots: the raw prompt's T5 ids + EOS, padded with
  0; a longer prompt keeps its first 511 ids and EOS. The same ids seed the adapter's 512 queries;
* the engine's T5 runs over the whole window with no key mask (`chroma_use_t5_mask` false, 1504-1506), so the
  teacher does too (PixArt's snapshot);
* the DiT masks its text keys with the T5 key mask plus one pad slot (`chroma_t5_mask_pad` 1; 1533,
  gk-diffuser.cpp:4389-4391): it reads the real slots, EOS and the first pad slot, min(real + 1, 512) rows a
  prompt — the supervised rows.

Evaluation: eval.json's `cos`, `cos_rms`, `rel_mse` and `worst_row_cos` are over those supervised rows.
Its `cos_eos` is the cosine at the last supervised slot, which for this pack is the first pad slot (EOS
only when the window is full), so the pack does not list it among its metrics under that name.
"""
from __future__ import annotations

from trainer_core.packs.base import EngineFacts
from trainer_core.packs.common.t5 import T5_EXPORT_KVS, T5_VOCAB, T5_WIDTH, T5EncoderPack
from trainer_core.packs.eval_guide import EvalGuide

__all__ = ["PACK", "CHROMA_WINDOW"]

CHROMA_WINDOW = 512   # chunk_len of T5CLIPEmbedder: the window's slots = the adapter's queries


PACK = T5EncoderPack(
    id="t5xxl_chroma",
    order=75,
    demo_order=8,
    title="Chroma (T5-XXL v1.1 → 512-query seeded resampler)",
    description=(
        "Replaces the 4.7B T5-XXL v1.1 encoder of Chroma (Chroma1-HD and its kin) with pig_clip and a "
        "512-query resampler whose queries are seeded with the T5 sentencepiece embedding of their slot in "
        "the engine's 512-slot window. The T5 tokenizer stays at inference; the encoder is never loaded. "
        "Targets are T5's last_hidden_state over the whole window with no mask, as the engine runs it for "
        "Chroma, at the slots its DiT reads: the real slots, EOS and the first pad (~40 rows × 4096 a prompt)."
    ),
    adapter_kind="seeded_resampler",
    default_folder="t5_chroma_adapter",
    shard_contract="t5xxl_chroma/1",
    window=CHROMA_WINDOW,
    key_mask=False,
    dit_pad_slots=1,
    export_kvs={**T5_EXPORT_KVS,
                "adapter.target": ("chroma: t5_v1_1_xxl encoder last_hidden_state, unmasked 512-slot window "
                                   "(real slots, EOS and the first pad)")},
    max_len_student=512,
    reference_dims={"out_dim": T5_WIDTH, "num_queries": CHROMA_WINDOW, "seed_vocab": T5_VOCAB},
    metric_names=("cos", "cos_rms", "rel_mse", "worst_row_cos", "roundtrip_cos", "trained_steps", "val_batches"),
    engine=EngineFacts(versions=("chroma",)),
    ggk_model_args="--diffusion-model chroma1-hd-Q8_0.gguf --vae ae.safetensors",
    ggk_args="--llm {student} --llm-adapter {gguf}",
    judge=EvalGuide(
        headline="cos", also=("rel_mse",),
        good="cos over the rows the DiT reads (real slots, EOS, the first pad slot); PixArt, with the same teacher "
             "and student, plateaus at 0.80–0.83, a guide and not a Chroma figure",
        source="none: no reference run of Chroma with an adapter is published"),
)
