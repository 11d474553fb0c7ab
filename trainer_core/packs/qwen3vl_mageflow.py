"""MageFlow-Edit: the Qwen3-VL-4B-Instruct text stack → pig_clip + a token-aligned vision adapter."""
from __future__ import annotations

from .base import STUDENT_MATERIALS, Material, TrainerPack

TEACHER = Material("teacher", "Qwen3-VL-4B-Instruct (teacher)", "hf_snapshot", repo="Qwen/Qwen3-VL-4B-Instruct",
                   patterns=("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors",
              "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
              "chat_template.json"),
                   subdir="Qwen3-VL-4B-Instruct", size_hint="~8.3 GB")

EDIT_PREFIX = (  # 64 tokens
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
T2I_PREFIX = (  # 34 tokens
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"  # 5 tokens

PACK = TrainerPack(
    id="qwen3vl_mageflow",
    title="MageFlow-Edit (Qwen3-VL-4B-Instruct → token-aligned + vision)",
    description=(
        "Replaces the Qwen3-VL-4B-Instruct text stack of MageFlow-Edit with pig_clip and a "
        "token-aligned adapter with a vision extension (the trainer5 recipe): a frozen "
        "vision_proj (2560 → 1024) and a trained vis_in let the unchanged "
        "mmproj-qwen3vl-4b-it-f16.gguf vision encoder drive editing as well as text-to-image. "
        "Trains on an image corpus (Flickr30k by default) with synthesized edit instructions."
    ),
    adapter_kind="token_aligned_vision",
    corpus_kind="image",
    default_folder="qwen3vl_4b_adapter",
    shard_contract="qwen3vl_mageflow/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    defaults={
        "corpus": {
            "image_presets": ["flickr30k"],
            "n_image": 56000, "n_two": 3000, "n_text": 27000,
            "n_val_image": 1024, "n_val_text": 512,
            "empty_frac": 0.015,
        },
        "precompute": {
            "shard_size": 512, "val_shard_size": 256,
            "teacher_batch": 0, "tok_budget": 0, "student_batch": 0,
            "student_tok_budget": 0, "vis_tok_budget": 0, "teacher_mode": "auto",
        },
        "train": {"depth": 4},
        "export": {"export_sigvq": False},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": "final_norm",
    },
    t2i_template=T2I_PREFIX + "{text}" + SUFFIX,
    t2i_start=34,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos_slice", "cos_vis", "cos_txt", "cos", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos", "trained_steps", "val_samples"),
    ggk_args="--llm pig_clip-q8_0.gguf --llm-adapter {gguf} --llm_vision mmproj-qwen3vl-4b-it-f16.gguf",
)
