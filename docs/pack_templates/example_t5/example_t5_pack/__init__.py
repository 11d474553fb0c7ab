"""Example pack: a T5 encoder (the teacher) → pig_clip + a seeded resampler (the adapter kind the
engine's T5 runner reads), for an engine family that conditions on a 120-slot T5 window.

This is the template of docs/ADDING_A_PACK.md. It is a declaration over the T5 machinery packs share
(trainer_core.packs.common.t5: the teacher over the window, its mock, the demo's tiny real T5 and
the precompute hooks); a family with a teacher of its own writes those hooks in its own module
(teacher.py, tiny.py) the same way (the TrainerPack hooks are listed in trainer_core/packs/base.py).
"""
from __future__ import annotations

from trainer_core.packs.base import STUDENT_MATERIALS, Material
from trainer_core.packs.common.t5 import T5_VOCAB, T5_WIDTH, T5_WINDOW, T5EncoderPack

__all__ = ["PACK", "TEACHER"]

# The teacher's files: a Hugging Face snapshot the Download tab fetches (or a folder the user picks).
# The demo writes a tiny real T5 in the same place instead (build_demo_materials).
TEACHER = Material(
    "teacher", "T5 v1.1 encoder (teacher)", "hf_snapshot", repo="callgg/t5-v1_1-xxl-encoder-bf16",
    patterns=("config.json", "model.safetensors", "special_tokens_map.json", "spiece.model",
              "tokenizer_config.json"),
    subdir="example-t5-encoder", size_hint="~9.5 GB",
    hint="the teacher of the example pack: any T5 v1.1 encoder snapshot")

PACK = T5EncoderPack(
    id="example_t5",                     # unique among the installed packs; also names the shard contract
    order=900,                           # where the GUI lists it
    demo_order=900,                      # it has a demo (`gguf-trainer demo --pack example_t5`)
    title="Example (T5 v1.1 → 120-query seeded resampler)",
    description="The template pack of docs/ADDING_A_PACK.md: a T5 encoder distilled into pig_clip and a "
                "seeded resampler.",
    adapter_kind="seeded_resampler",     # a registered kind (trainer_core/contract/kinds/)
    default_folder="example_t5_adapter",
    shard_contract="example_t5/1",       # bump it whenever what a shard holds changes
    teacher_repo="callgg/t5-v1_1-xxl-encoder-bf16",
    defaults={"corpus": {"n_train": 60000, "n_val": 1024},
              "precompute": {"teacher_batch": 0, "tok_budget": 0, "student_batch": 0},
              "train": {"depth": 6}},
    export_kvs={"adapter.t5_vocab": T5_VOCAB, "adapter.qwen_hidden_source": "final_norm",
                "adapter.target": "t5 encoder last_hidden_state, 120-slot window",
                "adapter.teacher": "callgg/t5-v1_1-xxl-encoder-bf16"},
    max_len_student=256,
    reference_dims={"out_dim": T5_WIDTH, "num_queries": T5_WINDOW, "seed_vocab": T5_VOCAB},
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos", "rel_mse", "worst_row_cos", "roundtrip_cos", "trained_steps"),
    ggk_model_args="--diffusion-model MODEL.gguf --vae VAE.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf}",
)
