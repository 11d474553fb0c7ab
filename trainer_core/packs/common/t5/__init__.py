"""A pack whose teacher is a T5 encoder read over the engine's caption window, and whose adapter is a
seeded resampler (one query per window slot, seeded with the slot's T5 id): the teacher and the
mock (teacher.py), the demo's tiny real T5 (tiny.py), and the pack hooks over them (`T5EncoderPack`).
A T5 engine family is a declaration of this class (packs/t5xxl_pixart/, docs/pack_template/)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.packs.base import Budgets, TrainerPack

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["T5EncoderPack", "T5_WIDTH", "T5_VOCAB", "T5_WINDOW"]

# the reference shapes (T5-XXL v1.1); the stages read the real ones from the teacher's config
T5_WIDTH, T5_VOCAB = 4096, 32128
T5_WINDOW = 120  # the caption window = the seeded queries (teacher.T5_WINDOW)
_PROMPT_TOKENS = 50  # the disk estimate's caption of a preset: ~60 student rows, ~40 T5 pieces


@dataclass(frozen=True)
class T5EncoderPack(TrainerPack):
    teacher_class = "trainer_core.packs.common.t5.teacher:T5Teacher"
    """The hooks of a T5-encoder pack: its declaration names the teacher material ("teacher")."""

    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """d_model and vocab_size of the teacher's config.json (the reference shape when the
        teacher is mocked and not downloaded)."""
        config = self.material_json(project)
        if config is None:
            return {"out_dim": T5_WIDTH, "seed_vocab": T5_VOCAB, "num_queries": T5_WINDOW}
        return {"out_dim": int(config["d_model"]), "seed_vocab": int(config["vocab_size"]),
                "num_queries": T5_WINDOW}

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A sample's shard rows (bf16): the prompt's student rows and its real T5 slots (the pieces, EOS and the
        first pad: what the DiT reads), plus the window's seed ids (int32)."""
        tokens = self.prompt_tokens(project, _PROMPT_TOKENS)
        return tokens * student_dim * 2 + (tokens + 2) * dims["out_dim"] * 2 + dims.get("num_queries", T5_WINDOW) * 4

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.common.t5.teacher import MockT5Teacher
        dims = self.teacher_dims(project)
        return MockT5Teacher(dims["out_dim"], dims["seed_vocab"])

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.common.t5.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device)
        student_batch = p.student_batch or auto["student_batch"]
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       student_batch, p.student_tok_budget or student_batch * self.max_len_student)

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

    def adapter_kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        """adapter.t5_vocab is the trained seed table's size, not the reference one."""
        return {**self.export_kvs, "adapter.t5_vocab": config.seed_vocab}

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny real T5 encoder, its sentencepiece model trained on the demo prompts."""
        from trainer_core.packs.common.t5.tiny import write_tiny_t5
        write_tiny_t5(self.resolve_material(project, "teacher"), prompts)


