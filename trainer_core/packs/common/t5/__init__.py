"""A pack whose teacher is a T5 encoder read over the engine's caption window, and whose adapter is a
seeded resampler (one query per window slot, seeded with the slot's T5 id): the teacher, the window's
rules and the mock (teacher.py), the demo's tiny real T5 (tiny.py), the T5-XXL v1.1 snapshot and the
recipe its families share, and the pack hooks over them (`T5EncoderPack`). A T5 engine family is a
declaration of this class with its window (packs/t5xxl_pixart/, packs/t5xxl_chroma/, docs/pack_template/)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, ExportContents, Material, TrainerPack
from trainer_core.packs.common.t5.reference import t5_reference

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["T5EncoderPack", "T5_WIDTH", "T5_VOCAB", "T5_WINDOW", "T5_REPO", "T5_TEACHER", "T5_DEFAULTS",
           "T5_EXPORT_KVS"]

# the reference shapes (T5-XXL v1.1); the stages read the real ones from the teacher's config
T5_WIDTH, T5_VOCAB = 4096, 32128
T5_WINDOW = 120  # PixArt's caption window = the seeded queries (teacher.T5_WINDOW)
_PROMPT_TOKENS = 50  # the disk estimate's caption of a preset: ~60 student rows, ~40 T5 pieces

T5_REPO = "callgg/t5-v1_1-xxl-encoder-bf16"
T5_TEACHER = Material(
    "teacher", "T5-XXL v1.1 encoder (teacher)", "hf_snapshot", repo=T5_REPO,
    patterns=("config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
              "spiece.model", "tokenizer_config.json"),
    subdir="t5-v1_1-xxl-encoder-bf16", size_hint="~9.5 GB", model=True,
    hint="a ~12 GiB GPU budget keeps it resident; smaller cards stream its layers from RAM")
# the original trainer recipe: 120k prompts, depth 6, a σ floor of 0.03; budgets chosen per card
T5_DEFAULTS = {
    "corpus": {"n_train": 120000, "n_val": 2048, "empty_frac": 0.01},
    "precompute": {"shard_size": 1024, "val_shard_size": 512, "teacher_batch": 0, "tok_budget": 0,
                   "student_batch": 0, "teacher_mode": "auto"},
    "train": {"depth": 6, "sigma_floor": 0.03},
}
T5_EXPORT_KVS = {"adapter.t5_vocab": T5_VOCAB, "adapter.qwen_hidden_source": "final_norm",
                 "adapter.target": "t5_v1_1_xxl encoder last_hidden_state, 120-slot PixArt window",
                 "adapter.teacher": T5_REPO}


@dataclass(frozen=True)
class T5EncoderPack(TrainerPack):
    """The hooks of a T5-encoder pack: its declaration names the teacher material ("teacher") and the window's
    rules: `window` slots (the adapter's queries), the teacher's `key_mask`, and the pad slots after the real
    ones the DiT reads (`dit_pad_slots`, supervised too)."""

    teacher_class: str = "trainer_core.packs.common.t5.teacher:T5Teacher"
    teacher_repo: str = T5_REPO
    materials: tuple[Material, ...] = STUDENT_MATERIALS + (T5_TEACHER,)
    defaults: Mapping[str, Any] = field(default_factory=lambda: T5_DEFAULTS)
    export_kvs: Mapping[str, Any] = field(default_factory=lambda: T5_EXPORT_KVS)
    reference_forward: Callable[..., list[Any]] | None = t5_reference
    window: int = T5_WINDOW
    key_mask: bool = True
    dit_pad_slots: int = 0

    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """d_model and vocab_size of the teacher's config.json (the reference shape when the
        teacher is mocked and not downloaded), and the window's slots."""
        from trainer_core.packs.lookup import material_json
        config = material_json(project)
        if config is None:
            return {"out_dim": T5_WIDTH, "seed_vocab": T5_VOCAB, "num_queries": self.window}
        return {"out_dim": int(config["d_model"]), "seed_vocab": int(config["vocab_size"]),
                "num_queries": self.window}

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        from trainer_core.packs.lookup import placed_teacher
        return placed_teacher(project, "teacher", device, window=self.window, key_mask=self.key_mask,
                              dit_pad_slots=self.dit_pad_slots)

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A sample's shard rows (bf16): the prompt's student rows and its real T5 slots (the pieces, EOS and the
        first pad: what the DiT reads), plus the window's seed ids (int32)."""
        from trainer_core.packs.estimates import prompt_tokens
        tokens = prompt_tokens(project, _PROMPT_TOKENS)
        return tokens * student_dim * 2 + (tokens + 2) * dims["out_dim"] * 2 + dims.get("num_queries", T5_WINDOW) * 4

    def prompt_inputs(self, project: "ProjectFolder | None", adapter: Any, text: str, vis: Any) -> dict[str, Any]:
        """The window's T5 ids the engine builds for the prompt (`--t5-ids`), from the project's T5 tokenizer
        (the teacher snapshot's vocabulary, as the engine's own T5 tokenizer reads it); none without a project."""
        if project is None:
            return {}
        from trainer_core.contract.engine_t5 import EngineT5
        from trainer_core.packs.lookup import require_material
        ids, _ = EngineT5.from_folder(require_material(project, "teacher")).windows([text], self.window)
        return {"--t5-ids": ids[0].tolist()}

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.common.t5.teacher import MockT5Teacher
        dims = self.teacher_dims(project)
        return MockT5Teacher(dims["out_dim"], dims["seed_vocab"], self.window, self.dit_pad_slots)

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        """The T5 budgets; without the key mask teacher_batch is cut so that a batch's full windows fit
        tok_budget (such a teacher runs every slot of every prompt, however few it keeps)."""
        from trainer_core.packs.common.t5.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device)
        student_batch = p.student_batch or auto["student_batch"]
        b = Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                    student_batch, p.student_tok_budget or student_batch * self.max_len_student)
        if self.key_mask:
            return b
        return replace(b, teacher_batch=max(1, min(b.teacher_batch, b.tok_budget // self.window)))

    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        windows, lens = teacher.seed_windows(prompts)                       # [S, 120], [S]
        lens_list = lens.tolist()
        order = sorted(range(len(prompts)), key=lens_list.__getitem__)     # stable: by seed length
        prompts = [prompts[i] for i in order]
        windows, lens = windows[order], lens[order]
        # each sample's real slots written straight into the packed rows (batches run in sample order):
        # a list of batch outputs and a cat would hold the rows twice
        t_pack: torch.Tensor | None = None                                  # [Σ seed_len, out] bf16
        at = 0
        for batch in greedy_batches(lens.tolist(), budgets.teacher_batch, budgets.tok_budget):
            out = teacher.forward(windows[batch], lens[batch]).to("cpu", torch.bfloat16)  # [b, L, out]
            if t_pack is None:
                t_pack = torch.empty(int(lens.sum()), out.shape[-1], dtype=torch.bfloat16)
            for j, i in enumerate(batch):
                n = int(lens[i])
                t_pack[at:at + n] = out[j, :n]
                at += n
        assert t_pack is not None and at == t_pack.shape[0]                 # a shard has at least one prompt
        tokens, q_rows, truncated = student.rows([student.ids(self.student_chunks(p)) for p in prompts],
                                                 self.max_len_student, budgets.student_batch,
                                                 budgets.student_tok_budget)
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(ids) for ids in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows),                                     # [T, in] bf16
            "t_pack": t_pack,
            "t_len": lens.to(torch.int32),
            "seed_ids": windows.to(torch.int32),                             # [S, 120]
            "seed_len": lens.to(torch.int32),
            **target_moments(t_pack),
        }
        return tensors, {"prompts": prompts, "num_queries": int(windows.shape[1]),
                         "truncated_student": truncated}

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("seeded_resampler", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, num_queries=dims["num_queries"], seed_vocab=dims["seed_vocab"])

    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        """adapter.t5_vocab is the trained seed table's size, not the reference one."""
        return ExportContents(kvs={**self.export_kvs, "adapter.t5_vocab": config.seed_vocab})

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny real T5 encoder, its sentencepiece model trained on the demo prompts."""
        from trainer_core.packs.common.t5.tiny import write_tiny_t5
        from trainer_core.packs.lookup import resolve_material
        write_tiny_t5(resolve_material(project, "teacher"), prompts)


