"""LLaDA-Image-Turbo: the 16B LLaDA2-MoE text stack → pig_clip + a 256-query resampler."""
from __future__ import annotations

from .base import STUDENT_MATERIALS, Material, TrainerPack

TEACHER = Material(
    "teacher", "LLaDA-Image-Turbo text encoder, QueryFormer, text_projection, tokenizer (teacher)",
    "hf_snapshot", repo="inclusionAI/LLaDA-Image-Turbo",
    patterns=("model_index.json", "text_encoder/*", "queryformer/*", "text_projection/*", "tokenizer/*"),
    subdir="LLaDA-Image-Turbo", size_hint="~33 GB",
    hint="needs ~34 GB of combined GPU + CPU memory to run")
SIGVQ = Material("sigvq", "SigVQ vision encoder (exported beside the adapter)", "hf_snapshot",
                 repo="inclusionAI/LLaDA-Image-Turbo", patterns=("sigvq/*",), subdir="LLaDA-Image-Turbo",
                 required=False, size_hint="~2.4 GB")

TEMPLATE = "<role>HUMAN</role> Generate an image: {text}\n<role>ASSISTANT</role>\n<IMAGE1>"
EMPTY = "<role>HUMAN</role> Generate an image.\n<role>ASSISTANT</role>\n<IMAGE1>"  # a period, no ": "

PACK = TrainerPack(
    id="llada_image",
    title="LLaDA-Image-Turbo (LLaDA2-MoE 16B → 256-query resampler)",
    description=(
        "Replaces the 16B LLaDA2-MoE text encoder of LLaDA-Image-Turbo with pig_clip and a "
        "seedless 256-query Perceiver resampler (the trainer8 recipe). The teacher target is the "
        "256 QueryFormer rows of cap_feats after the 6-layer text_projection; the adapter is "
        "text-only and pairs unchanged with the model's SigVQ vision encoder for editing. "
        "The teacher needs ~34 GB of combined GPU + CPU memory."
    ),
    adapter_kind="resampler",
    corpus_kind="text",
    default_folder="llada_adapter",
    shard_contract="llada_image/2",
    teacher_repo="inclusionAI/LLaDA-Image-Turbo",
    defaults={},  # the built-in defaults are this recipe's
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "llada_image_turbo text_projection query rows",
        "adapter.teacher": "inclusionAI/LLaDA-Image-Turbo",
    },
    ggk_min_version="0.5.7",
    t2i_template=TEMPLATE,
    t2i_empty=EMPTY,
    max_len_student=512,
    materials=STUDENT_MATERIALS + (TEACHER, SIGVQ),
    metric_names=("cos_centered", "cos_rms", "worst_row_cos_rms", "rel_mse", "cos_raw", "roundtrip_cos",
                  "trained_steps", "val_batches"),
    ggk_args="--llm pig_clip-q8_0.gguf --llm-adapter {gguf} --llm_vision pig_llada_sigvq-f16.gguf",
)
