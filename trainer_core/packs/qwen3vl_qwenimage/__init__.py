"""Qwen-Image 2.1: the full Qwen3-VL-8B-Instruct → pig_clip + a token-aligned vision adapter.

The teacher is Hugging Face's own forward (deepstack, real M-RoPE image positions) tapped before
the final norm; only the text rows the DiT consumes (from position 14 on, not under an image slot)
are stored, supervised and measured; references are rendered at an area drawn per sample
(qwenimage_data). The machinery is vision_pack.VisionPack.
"""
from __future__ import annotations

from trainer_core.packs.common.qwen3vl.qwenimage_data import START, SYSTEM, USER
from trainer_core.packs.common.qwen3vl.vision_data import SUFFIX
from trainer_core.packs.base import STUDENT_MATERIALS, EngineFacts
from trainer_core.packs.common.qwen3vl.references import vision_text_reference
from trainer_core.packs.common.qwen3vl.vision_pack import IMAGE_DEMO_SETTINGS, VisionPack, qwen3vl_teacher
from trainer_core.packs.eval_guide import EvalGuide

__all__ = ["PACK", "TEACHER", "SYSTEM", "USER", "SUFFIX", "OUT_DIM", "VIS_DIM"]

# the reference shapes (Qwen3-VL-8B): text hidden and the vision merger's output
OUT_DIM, VIS_DIM = 4096, 4096

TEACHER = qwen3vl_teacher("Qwen3-VL-8B-Instruct", "~17.5 GB",
                          "resident needs a card of about 24 GB; smaller cards stream the text stack from RAM")

PACK = VisionPack(
    id="qwen3vl_qwenimage",
    order=30,
    demo_order=4,
    title="Qwen-Image 2.1 (Qwen3-VL-8B-Instruct → token-aligned + vision)",
    description=(
        "Replaces the Qwen3-VL-8B-Instruct text stack of Qwen-Image 2.1 with pig_clip and a "
        "token-aligned adapter with a 4096 ↔ 1024 vision bridge, distilled from the full Hugging "
        "Face model (deepstack, M-RoPE image positions, pre-norm tap). Only the rows the DiT reads "
        "are trained. Text-to-image needs only the adapter; editing pairs it with the unchanged "
        "mmproj-qwen3vl-8b-it-f16.gguf. Needs ggk 0.6.6+."
    ),
    adapter_kind="token_aligned_vision",
    default_folder="qwen3vl_8b_adapter",
    shard_contract="qwen3vl_qwenimage/1",
    teacher_repo="Qwen/Qwen3-VL-8B-Instruct",
    defaults={
        "corpus": {
            "image_presets": ["flickr30k"],
            "n_image": 30000, "n_two": 2000, "n_text": 40000,
            "n_val_image": 512, "n_val_text": 512,
            "empty_frac": 0.015,
        },
        "precompute": {
            "shard_size": 256, "val_shard_size": 128,
            "teacher_batch": 0, "tok_budget": 0, "student_batch": 0,
            "student_tok_budget": 0, "vis_tok_budget": 0, "teacher_mode": "auto",
        },
        "train": {"depth": 4},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-8B-Instruct",
        "adapter.teacher_tap": "pre_norm_last_layer",
        "adapter.teacher_deepstack": True,
        "adapter.vision_contract": "qwen_image_2_1",
        "adapter.supervised_rows": "consumed_text",
    },
    ggk_min_version="0.6.6",
    t2i_template=SYSTEM + USER + "{text}" + SUFFIX,
    t2i_empty=SYSTEM + USER + " " + SUFFIX,  # an empty prompt becomes a single space
    t2i_start=START,
    max_len_student=2304,
    reference_dims={"out_dim": OUT_DIM, "vis_dim": VIS_DIM},
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos_slice", "cos_edit", "cos_t2i", "cos", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos",
                  "trained_steps", "val_samples"),
    reference_forward=vision_text_reference,
    engine=EngineFacts(versions=("qwen_image_2_1",), teacher="qwen3_vl", references="mmproj", reference_area=True,
                       edit_tokens=True),
    ggk_args="--llm {student} --llm-adapter {gguf}",
    # the demo's images rendered at 128² or 192² (16 or 36 slots) instead of 384²…1024²
    demo_settings=IMAGE_DEMO_SETTINGS + ("corpus.ref_areas=[[16384, 0.5], [36864, 0.5]]",
                                         "corpus.two_image_max_area=16384"),
    ggk_edit_args="--llm_vision mmproj-qwen3vl-8b-it-f16.gguf",
    contract="qwen_image_2_1",
    reference_side=0,
    tap="pre_norm_last_layer",
    supervise="consumed_text",
    budget_scale=0.5,
    probe_counts=(144, 256),
    judge=EvalGuide(
        headline="cos_slice", also=("cos_t2i", "cos_edit", "rel_mse"),
        good="cos_slice is exactly the rows the DiT consumes, split into cos_t2i (text-only samples) and cos_edit "
             "(image samples); the pre-norm tap runs plain cosine high, so compare runs by rel_mse as well",
        source="none: no reference run of Qwen-Image 2.1 with an adapter is published"),
)
