"""MageFlow-Edit: the Qwen3-VL-4B-Instruct text stack → pig_clip + a token-aligned vision adapter.

The reduced teacher as ggk runs it (final-norm tap, no deepstack, 1-D positions), every real token
supervised, the 64 / 34-token templates of vision_data; the machinery is vision_pack.VisionPack.
"""
from __future__ import annotations

from trainer_core.packs.common.qwen3vl.vision_data import EDIT_PREFIX, SUFFIX, T2I_PREFIX, T2I_START
from trainer_core.packs.base import STUDENT_MATERIALS, EngineFacts
from trainer_core.packs.common.qwen3vl.references import vision_text_reference
from trainer_core.packs.common.qwen3vl.vision_pack import IMAGE_DEMO_SETTINGS, VisionPack, qwen3vl_teacher
from trainer_core.packs.eval_guide import EvalGuide

__all__ = ["PACK", "TEACHER", "EDIT_PREFIX", "T2I_PREFIX", "SUFFIX", "OUT_DIM", "VIS_DIM"]

# the reference shapes (Qwen3-VL-4B): text hidden and the vision merger's output
OUT_DIM, VIS_DIM = 2560, 2560

TEACHER = qwen3vl_teacher("Qwen3-VL-4B-Instruct", "~8.3 GB",
                          "resident needs about 11 GB of GPU memory; smaller cards stream the text stack from RAM")

PACK = VisionPack(
    id="qwen3vl_mageflow",
    order=20,
    demo_order=3,
    title="MageFlow-Edit (Qwen3-VL-4B-Instruct → token-aligned + vision)",
    description=(
        "Replaces the Qwen3-VL-4B-Instruct text stack of MageFlow-Edit with pig_clip and a "
        "token-aligned adapter with a vision extension (the recipe of the published reference run): a frozen "
        "vision_proj (2560 → 1024) and a trained vis_in let the unchanged "
        "mmproj-qwen3vl-4b-it-f16.gguf vision encoder drive editing as well as text-to-image. "
        "Trains on an image corpus (Flickr30k by default) with synthesized edit instructions."
    ),
    adapter_kind="token_aligned_vision",
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
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": "final_norm",
    },
    reference_dims={"out_dim": OUT_DIM, "vis_dim": VIS_DIM},
    t2i_template=T2I_PREFIX + "{text}" + SUFFIX,
    t2i_start=T2I_START,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos_slice", "cos_vis", "cos_txt", "cos", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos",
                  "trained_steps", "val_samples"),
    judge=EvalGuide(
        headline="cos_slice", also=("cos_vis", "cos_txt"),
        good="cos_slice covers the rows the DiT consumes; a lagging cos_vis means the vis_in path or the width is "
             "the limit, not the student; the reference run's A/B edits were near-identical to the teacher's",
        references=(("cos_vis", "0.80"), ("cos_txt", "0.98"), ("cos", "0.915")),
        source="gguf-trainer 0.0.14's pack hint (the published package, PyPI): "
               "the reference run's val cos 0.915, vision "
               "positions 0.80, text 0.98 (raw cosine over every real token, what eval.json's cos / cos_vis / "
               "cos_txt measure); no figure is published for cos_slice itself"),
    reference_forward=vision_text_reference,
    engine=EngineFacts(versions=("mage_flow",), teacher="qwen3_vl", references="mmproj", edit_tokens=True),
    ggk_model_args="--diffusion-model mageflow-edit-turbo-nvfp4.gguf --vae pig_mageflow_vae_fp32-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --llm_vision mmproj-qwen3vl-4b-it-f16.gguf",
    demo_settings=IMAGE_DEMO_SETTINGS,
)
