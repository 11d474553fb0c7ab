"""Z-Image (Turbo / Base): Qwen3-4B hidden_states[35] → pig_clip + a token-aligned adapter.

The DiT reads, per row of the chat template from row 0 on, Qwen3-4B's output of decoder layer 35 before
any norm (2560 wide); its caption embedder normalizes each row, so the per-dimension pattern matters more
than the row scale. pig_clip shares the Qwen BPE, so it runs the teacher's exact ids and positions, and a
token-aligned adapter maps each student row to the teacher's row at the same place — the kind the engine
runs when the file has no query, no slot bank and no layer_map (template.py; engine-adapter-families §1.1).
Text-to-image only: a declaration of the token-aligned text family (common/token_aligned_text.py).
"""
from __future__ import annotations

from trainer_core.packs.base import STUDENT_MATERIALS, EngineFacts, Material
from trainer_core.packs.common.qwen_chat import PREFIX, SUFFIX
from trainer_core.packs.common.token_aligned_text import TokenAlignedTextPack, last_but_one
from trainer_core.packs.eval_guide import EvalGuide
from trainer_core.packs.qwen3_zimage.template import N_LAYERS, TAP

__all__ = ["PACK", "TEACHER"]

OUT_DIM = 2560                          # Qwen3-4B's width: the reference shape
_REPO = "Qwen/Qwen3-4B"

TEACHER = Material(
    "teacher", "Qwen3-4B (teacher)", "hf_snapshot", repo=_REPO,
    patterns=("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors",
              "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"),
    subdir="Qwen3-4B", size_hint="~8 GB", model=True,
    hint="the Z-Image text encoder (Z-Image's text_encoder folder holds the same weights); only layers 1 … 35 "
         "run: resident it needs about 11 GB of GPU memory, smaller cards stream it from RAM")


PACK = TokenAlignedTextPack(
    id="qwen3_zimage",
    order=15,
    demo_order=10,
    title="Z-Image (Qwen3-4B layer 35 → token-aligned)",
    description=(
        "Replaces the Qwen3-4B text encoder of Z-Image Turbo and Base with pig_clip and a token-aligned adapter: "
        "every row of the chat template becomes the teacher's hidden_states[35] (pre-norm, 2560), the row the "
        "DiT's caption embedder reads. Text-to-image only (the engine's Z-Image edit path is not wired). "
        "Needs ggk 0.9.7 or later."
    ),
    adapter_kind="token_aligned_vision",
    default_folder="qwen3_4b_zimage_adapter",
    shard_contract="qwen3_zimage/1",
    teacher_repo=_REPO,
    taps_of=last_but_one,
    family="Z-Image",
    defaults={
        "corpus": {"presets": ["gustavosta", "midjourney"], "n_train": 60000, "n_val": 1024, "empty_frac": 0.01,
                   "min_chars": 8, "max_chars": 1200},
        "precompute": {"shard_size": 1024, "val_shard_size": 512, "teacher_batch": 0, "tok_budget": 0,
                       "student_batch": 0, "student_tok_budget": 0, "teacher_mode": "auto"},
        "train": {"depth": 4},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": _REPO,
        "adapter.teacher_tap": f"layer {TAP} (hidden_states[{TAP}], pre-norm)",
        "adapter.target": f"z_image caption features (Qwen3-4B hidden_states[{TAP}], {OUT_DIM} per template token)",
        "adapter.student_prompt": "zimage_template",
    },
    ggk_min_version="0.9.7",
    t2i_template=PREFIX + "{text}" + SUFFIX,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos", "cos_slice", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos", "trained_steps",
                  "val_samples"),
    engine=EngineFacts(versions=("z_image",), teacher="qwen3"),
    ggk_model_args="--diffusion-model z-image-turbo-nvfp4.gguf --vae ae.safetensors",
    ggk_args="--llm {student} --llm-adapter {gguf} --cfg-scale 1 --steps 8",
    reference_dims={"out_dim": OUT_DIM, "n_layers": N_LAYERS},
    demo_settings=("train.lr=0.002",),
    judge=EvalGuide(
        headline="cos_slice", also=("rel_mse",),
        good="the DiT reads every template row, which cos_slice averages per sample; the tap is pre-norm (a few "
             "huge dimensions run plain cosine high), so compare runs by rel_mse as well",
        source="none: no reference run of Z-Image with an adapter is published"),
)
