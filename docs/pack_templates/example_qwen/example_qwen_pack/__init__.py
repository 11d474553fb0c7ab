"""Example pack: a Qwen3 text model read at its final norm (the teacher) → pig_clip + a token-aligned adapter, for
an engine family whose conditioner hands the DiT the final-norm row of every token of the Qwen chat template.

The second template of docs/ADDING_A_PACK.md: a pack with a teacher and a `make_shard` of its own (teacher.py,
shards.py), written against the seam alone — the hooks of `trainer_core.packs.base.TrainerPack`, the helpers of
`trainer_core.packs.lookup`, the chat template of `trainer_core.packs.common.qwen_chat` and the tiny Qwen3 of
`trainer_core.packs.common.qwen3.tiny` for its demo. It ships as its own distribution (pyproject.toml).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, Material, TrainerPack
from trainer_core.packs.common.qwen_chat import PREFIX, SUFFIX, chat_chunks
from trainer_core.packs.eval_guide import EvalGuide
from trainer_core.packs.lookup import material_json, resolve_material

__all__ = ["PACK", "ExampleQwenPack", "TEACHER"]

REPO = "Qwen/Qwen3-1.7B"
WIDTH = 2048                       # the reference width, for estimates before the teacher is on disk

TEACHER = Material(
    "teacher", "Qwen3-1.7B (teacher)", "hf_snapshot", repo=REPO, model=True,
    patterns=("config.json", "model*.safetensors", "model.safetensors.index.json", "tokenizer.json",
              "tokenizer_config.json", "vocab.json", "merges.txt"),
    subdir="Qwen3-1.7B", size_hint="~4 GB", hint="any Qwen3 text model; the targets are its final-norm rows")


@dataclass(frozen=True)
class ExampleQwenPack(TrainerPack):
    teacher_class: str = "example_qwen_pack.teacher:FinalNormTeacher"

    # ---------------------------------------------------------------- the engine's prompt
    def student_chunks(self, text: str) -> list[str]:
        """The chat template's pieces, each tokenized on its own (the engine's rule)."""
        return chat_chunks(text)

    # ---------------------------------------------------------------- teacher
    def teacher_dims(self, project: Any) -> dict[str, int]:
        config = material_json(project)          # None: the mock stands in and the teacher is not on disk
        return {"out_dim": int(config["hidden_size"]) if config else WIDTH}

    def build_mock_teacher(self, project: Any) -> Any:
        from example_qwen_pack.teacher import MockTeacher
        return MockTeacher(self.teacher_dims(project)["out_dim"])

    # ---------------------------------------------------------------- shards
    def make_shard(self, samples: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        from example_qwen_pack.shards import token_aligned_shard
        return token_aligned_shard(samples, student, teacher, budgets, self.student_chunks, self.max_len_student)

    def shard_bytes(self, project: Any, dims: Mapping[str, int], student_dim: int) -> float:
        from trainer_core.packs.estimates import prompt_tokens
        return (8 + prompt_tokens(project, 60)) * (student_dim + dims["out_dim"]) * 2

    # ---------------------------------------------------------------- adapter
    def adapter_config(self, project: Any, in_dim: int, dims: Mapping[str, int] | None = None) -> Any:
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_vision", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth)

    # ---------------------------------------------------------------- demo
    def build_demo_materials(self, project: Any, prompts: list[str]) -> None:
        from trainer_core.packs.common.qwen3.tiny import write_tiny_qwen3
        write_tiny_qwen3(resolve_material(project, "teacher"))


def _reference(project: Any, samples: list[str]) -> list[Any]:
    from example_qwen_pack.teacher import reference_rows
    return reference_rows(project, samples)


PACK = ExampleQwenPack(
    id="example_qwen",                   # unique among the installed packs
    order=910,                           # where the GUI lists it
    demo_order=910,                      # it has a demo (`gguf-trainer demo --pack example_qwen`)
    title="Example (Qwen3 final norm → token-aligned)",
    description="The second template pack of docs/ADDING_A_PACK.md: a Qwen3 text model's final-norm rows over the "
                "chat template distilled into pig_clip and a token-aligned adapter, with its own teacher and shards.",
    adapter_kind="token_aligned_vision",  # a registered kind: the engine runs a file with no query and no layer_map
    default_folder="example_qwen_adapter",
    shard_contract="example_qwen/1",      # bump it whenever what a shard holds changes
    teacher_repo=REPO,
    defaults={"corpus": {"presets": ["gustavosta"], "n_train": 30000, "n_val": 1024},
              "precompute": {"teacher_mode": "auto"}, "train": {"depth": 4}},
    export_kvs={"adapter.qwen_hidden_source": "final_norm", "adapter.teacher": REPO,
                "adapter.teacher_tap": "final_norm", "adapter.target": "final-norm rows per template token"},
    t2i_template=PREFIX + "{text}" + SUFFIX,
    max_len_student=512,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos", "cos_slice", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos", "trained_steps",
                  "val_samples"),
    reference_dims={"out_dim": WIDTH},
    reference_forward=_reference,
    ggk_args="--llm {student} --llm-adapter {gguf}",
    demo_settings=("train.lr=0.002",),
    judge=EvalGuide(headline="cos_slice", also=("rel_mse",), good="the per-sample cosine over the rows the DiT reads",
                    source="none: an example pack"),
)
