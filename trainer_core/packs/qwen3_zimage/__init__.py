"""Z-Image (Turbo / Base): Qwen3-4B hidden_states[35] → pig_clip + a token-aligned adapter.

The DiT reads, per row of the chat template from row 0 on, Qwen3-4B's output of decoder layer 35 before
any norm (2560 wide); its caption embedder normalizes each row, so the per-dimension pattern matters more
than the row scale. pig_clip shares the Qwen BPE, so it runs the teacher's exact ids and positions, and a
token-aligned adapter maps each student row to the teacher's row at the same place — the kind the engine
runs when the file has no query, no slot bank and no layer_map (template.py; engine-adapter-families §1.1).
Text-to-image only: no vision rows, so the shards carry the token-aligned layout with no images.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, Material, TrainerPack
from trainer_core.packs.qwen3vl_flux3 import Flux3Pack
from trainer_core.packs.qwen3_zimage.template import (N_LAYERS, PREFIX, PREFIX_IDS, SUFFIX, SUFFIX_IDS, TAP,
                                                      fit_template, tap_for)
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "ZImagePack", "TEACHER"]

OUT_DIM = 2560                          # Qwen3-4B's width: the reference shape
_BODY_TOKENS = 60                       # the disk estimate's prompt without prompt files: ~60 tokens of body
_REPO = "Qwen/Qwen3-4B"

TEACHER = Material(
    "teacher", "Qwen3-4B (teacher)", "hf_snapshot", repo=_REPO,
    patterns=("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors",
              "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"),
    subdir="Qwen3-4B", size_hint="~8 GB",
    hint="the Z-Image text encoder (Z-Image's text_encoder folder holds the same weights); only layers 1 … 35 "
         "run: resident it needs about 11 GB of GPU memory, smaller cards stream it from RAM")


@dataclass(frozen=True)
class ZImagePack(TrainerPack):
    teacher_class = "trainer_core.packs.qwen3_zimage.teacher:Qwen3Teacher"

    budget_scale: float = 0.5
    # the FLUX.3 Klein template pieces, tokenizer checks and budgets: the engine builds the same template
    student_chunks = Flux3Pack.student_chunks
    prepare = Flux3Pack.prepare
    check_tokenizer = Flux3Pack.check_tokenizer
    budgets = Flux3Pack.budgets

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """hidden_size and num_hidden_layers of the teacher's config.json (the reference shapes when the
        teacher is mocked and not downloaded)."""
        config = self.material_json(project)
        if config is None:
            return dict(self.reference_dims)
        try:
            dims = {"out_dim": int(config["hidden_size"]), "n_layers": int(config["num_hidden_layers"])}
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"The teacher config in {self.resolve_material(project, 'teacher')} has no "
                                 f"hidden_size / num_hidden_layers; download {_REPO} again.") from None
        tap_for(dims["n_layers"])
        return dims

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.qwen3_zimage.teacher import MockZImageTeacher
        return MockZImageTeacher(self.teacher_dims(project)["out_dim"])

    # ------------------------------------------------------------ precompute
    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Token-aligned layout with no images (docs/SHARDS.md): per sample its template rows for the student
        and the teacher, every row supervised; samples sorted by length."""
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        full = [student.ids(self.student_chunks(p)) for p in prompts]
        truncated = sum(len(ids) > self.max_len_student for ids in full)
        tokens = [fit_template(ids, self.max_len_student) for ids in full]
        order = sorted(range(len(prompts)), key=lambda i: len(tokens[i]))
        prompts, tokens = [prompts[i] for i in order], [tokens[i] for i in order]
        t_rows: list[Any] = []
        for batch in greedy_batches([len(t) for t in tokens], budgets.teacher_batch, budgets.tok_budget):
            t_rows += [rows.to(torch.bfloat16) for rows in teacher.hidden([tokens[i] for i in batch])]
        _, q_rows, _ = student.rows(tokens, self.max_len_student, budgets.student_batch, budgets.student_tok_budget)
        t_pack = torch.cat(t_rows)
        none = torch.zeros(0, dtype=torch.int32)
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "v_pack": torch.zeros(0, 0, dtype=torch.bfloat16),
            "vis_sample": none, "vis_start": none, "vis_len": none,
            "sup_start": torch.zeros(len(tokens), dtype=torch.int32),
            "n_images": torch.zeros(len(tokens), dtype=torch.int32),
            "t_sparse": torch.tensor([0], dtype=torch.int64),
            **target_moments(t_pack),
        }
        return tensors, {"prompts": prompts, "num_queries": 0, "truncated_student": truncated,
                         "meta": {"tap": getattr(teacher, "tap", TAP), "supervise": "every_row"}}

    # ------------------------------------------------------------ train / export
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_vision", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth)

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per template token (3 + ~60 + 5)."""
        rows = len(PREFIX_IDS) + self.prompt_tokens(project, _BODY_TOKENS) + len(SUFFIX_IDS)
        return rows * (student_dim + dims["out_dim"]) * 2

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3 teacher (4 layers: the tap is hidden_states[3]) with the real Qwen tokenizer."""
        from trainer_core.packs.qwen3_zimage.tiny import write_tiny_qwen3
        write_tiny_qwen3(self.resolve_material(project, "teacher"))


PACK = ZImagePack(
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
    corpus_kind="text",
    default_folder="qwen3_4b_zimage_adapter",
    shard_contract="qwen3_zimage/1",
    teacher_repo=_REPO,
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
    engine_versions=("z_image",),
    ggk_model_args="--diffusion-model z-image-turbo-nvfp4.gguf --vae ae.safetensors",
    ggk_args="--llm {student} --llm-adapter {gguf} --cfg-scale 1 --steps 8",
    reference_dims={"out_dim": OUT_DIM, "n_layers": N_LAYERS},
    demo_settings=("train.lr=0.002",),
    judge=EvalGuide(
        headline="cos_slice", also=("rel_mse",),
        good="the DiT reads every template row, which cos_slice averages per sample; the tap is pre-norm (a few "
             "huge dimensions run plain cosine high), so compare runs by rel_mse as well",
        source="none: engine-adapter-families.md §1.1 names no reference run"),
)
