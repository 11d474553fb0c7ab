"""PixArt: the 4.7B T5-XXL v1.1 encoder → pig_clip + a 120-query resampler seeded with T5 ids."""
from __future__ import annotations

from .base import TrainerPack

PACK = TrainerPack(
    id="t5xxl_pixart",
    title="PixArt (T5-XXL v1.1 → 120-query seeded resampler)",
    description=(
        "Replaces PixArt's 4.7B T5-XXL v1.1 encoder (--t5xxl) with pig_clip and a 120-query "
        "resampler whose queries are seeded with the T5 sentencepiece embedding of their slot "
        "(the original trainer recipe). The T5 tokenizer stays at inference; the encoder is never "
        "loaded. Targets are T5's last_hidden_state at the real slots (~40 rows × 4096 a prompt)."
    ),
    adapter_kind="seeded_resampler",
    corpus_kind="text",
    default_folder="t5_adapter",
    shard_contract="t5xxl_pixart/1",
    teacher_repo="callgg/t5-v1_1-xxl-encoder-bf16",
    defaults={
        "corpus": {"n_train": 120000, "n_val": 2048, "empty_frac": 0.01},
        "precompute": {
            "shard_size": 1024, "val_shard_size": 512,
            "teacher_batch": 0, "tok_budget": 0, "student_batch": 0, "teacher_mode": "auto",
        },
        "train": {"depth": 6, "sigma_floor": 0.03},
        "export": {"export_sigvq": False},
    },
    export_kvs={
        "adapter.t5_vocab": 32128,
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "t5_v1_1_xxl encoder last_hidden_state, 120-slot PixArt window",
        "adapter.teacher": "callgg/t5-v1_1-xxl-encoder-bf16",
    },
)
