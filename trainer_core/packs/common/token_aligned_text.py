"""The token-aligned text families: per row of a Qwen template, the teacher's row at the same place (one tap, or
the final norm), learned by a token-aligned adapter with no vision, no query and no layer_map — the runner the
engine picks for such a file (`token_aligned_vision` with vis_dim 0).

A family is a declaration of `TokenAlignedTextPack`: its teacher (a plain Qwen3 by default, qwen3/teacher.py)
read at `taps_of(n_layers)` (Z-Image: the last layer but one, hidden_states[35] of Qwen3-4B), its template
(`chunks`, `check_template`), and the rows the engine drops before the DiT (`t2i_start`; every row from 0 is
supervised by default). Its shards carry the token-aligned layout with no images (docs/SHARDS.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.base import Budgets
from trainer_core.packs.common.qwen3.references import qwen3_reference
from trainer_core.packs.common.qwen_chat import PREFIX_IDS, SUFFIX_IDS, QwenTemplatePack, fit_template

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["TokenAlignedTextPack", "last_but_one"]

_BODY_TOKENS = 60                       # the disk estimate's prompt without prompt files: ~60 tokens of body


def last_but_one(n_layers: int) -> tuple[int, ...]:
    """hidden_states[N − 1] of an N-layer model ("-2": the output of the last layer but one, pre-norm)."""
    if n_layers < 2:
        raise ModelFileError(f"The teacher has {n_layers} decoder layer; the family reads hidden_states[-2], so it "
                             "needs at least 2.")
    return (n_layers - 1,)


@dataclass(frozen=True)
class TokenAlignedTextPack(QwenTemplatePack):
    teacher_class: str = "trainer_core.packs.common.qwen3.teacher:Qwen3Teacher"
    taps_of: Callable[[int], tuple[int, ...]] = last_but_one
    family: str = ""                          # how the teacher's load note names the family
    template_rows: int = len(PREFIX_IDS) + len(SUFFIX_IDS)   # the template's own rows (the disk estimate)
    reference_forward: Callable[..., list[Any]] | None = qwen3_reference

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """The teacher's width × its taps (out_dim) and depth, from its config.json (the reference shapes when
        the teacher is mocked and not downloaded)."""
        from trainer_core.packs.lookup import material_json, resolve_material
        config = material_json(project)
        if config is None:
            return dict(self.reference_dims)
        try:
            width, n_layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"The teacher config in {resolve_material(project, 'teacher')} has no "
                                 f"hidden_size / num_hidden_layers; download {self.teacher_repo} again.") from None
        return {"out_dim": width * len(self.taps_of(n_layers)), "n_layers": n_layers}

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        from trainer_core.packs.lookup import placed_teacher
        return placed_teacher(project, "teacher", device, self.teacher_class, taps_of=self.taps_of,
                              family=self.family, repo=self.teacher_repo)

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.common.qwen3.teacher import MockQwen3Teacher
        return MockQwen3Teacher(self.teacher_dims(project)["out_dim"])

    # ------------------------------------------------------------ precompute
    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Token-aligned layout with no images (docs/SHARDS.md): per sample its template rows for the student
        and the teacher, supervised from `t2i_start`; samples sorted by length."""
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
        supervised = t_pack if not self.t2i_start else torch.cat([rows[self.t2i_start:] for rows in t_rows])
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "v_pack": torch.zeros(0, 0, dtype=torch.bfloat16),
            "vis_sample": none, "vis_start": none, "vis_len": none,
            "sup_start": torch.full((len(tokens),), self.t2i_start, dtype=torch.int32),
            "n_images": torch.zeros(len(tokens), dtype=torch.int32),
            "t_sparse": torch.tensor([0], dtype=torch.int64),
            **target_moments(supervised),
        }
        taps = list(getattr(teacher, "taps", ()))
        return tensors, {"prompts": prompts, "num_queries": 0, "truncated_student": truncated,
                         "meta": {"taps": taps, "supervise": f"rows from {self.t2i_start}" if self.t2i_start
                                  else "every_row"}}

    # ------------------------------------------------------------ train / export
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_vision", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth)

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per template token."""
        from trainer_core.packs.estimates import prompt_tokens
        rows = self.template_rows + prompt_tokens(project, _BODY_TOKENS)
        return rows * (student_dim + dims["out_dim"]) * 2

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3 teacher (4 layers: the last but one is hidden_states[3]) with the real Qwen
        tokenizer."""
        from trainer_core.packs.common.qwen3.tiny import write_tiny_qwen3
        from trainer_core.packs.lookup import resolve_material
        write_tiny_qwen3(resolve_material(project, "teacher"))
