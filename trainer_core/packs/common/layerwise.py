"""The layerwise families: per row of a Qwen template, the teacher's hidden states at several taps side by side
(n_taps × layer_dim), learned by a token-aligned layerwise adapter (`token_aligned_layerwise`).

A family is a declaration of `LayerwisePack` with its own numbers:

* `taps_of(n_layers)`: the tapped layers of an n-layer teacher (FLUX.3 Klein: 8 spread over the depth; Krea 2:
  2, 5, …, 35), read by a forward hook on each (hidden_states[k], pre-norm);
* `pads`: how the engine pads the template and how a shard keeps the pads (`PadRows`): FLUX.3 Klein pads to a
  multiple of 80 at one rope position, so a sample's pads are one state and a shard stores one pad row the
  reader repeats with weight 1/n_pad; Krea 2 adds none;
* `t2i_start`: the rows the engine drops after the adapter, which are not supervised (Krea 2: the 34 rows of the
  system turn and user header); the adapter still runs over them;
* the template (`chunks`, `check_template`, from QwenTemplatePack) and the demo teacher's depth (`demo_layers`).

Targets are standardized with a per-tap relative σ floor and folded back at export (out_proj and skip): the
kind's, contract/tap_losses.py. The teacher is a Qwen3-VL text stack (qwen3vl/taps_teacher.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.base import Budgets
from trainer_core.packs.common.qwen3vl.references import layerwise_reference
from trainer_core.packs.common.qwen_chat import (PAD_ID, PREFIX_IDS, SUFFIX_IDS, QwenTemplatePack, fit_template,
                                                 padded_batch)

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["LayerwisePack", "PadRows", "NO_PADS", "LAYERWISE_DEFAULTS", "LAYERWISE_DEMO_SETTINGS"]

_BODY_TOKENS = 60                        # the disk estimate's prompt without prompt files: ~60 tokens of body

# the layerwise recipe (trainer6): a prompt corpus, width 1024, depth 4, 20k steps at batch 32, a σ floor of 0.05
# per tap, micro-batches of 8192 rows; and its demo (a higher lr, whole batches)
LAYERWISE_DEFAULTS = {
    "corpus": {"presets": ["gustavosta", "midjourney"], "n_train": 30000, "n_val": 1024, "empty_frac": 0.01,
               "min_chars": 8, "max_chars": 1200},
    "precompute": {"shard_size": 512, "val_shard_size": 256, "teacher_batch": 0, "tok_budget": 0,
                   "student_batch": 0, "student_tok_budget": 0, "teacher_mode": "auto"},
    "train": {"width": 1024, "depth": 4, "steps": 20000, "batch_size": 32, "sigma_floor": 0.05, "batch_tokens": 8192},
}
LAYERWISE_DEMO_SETTINGS = ("precompute.shard_size=120", "precompute.val_shard_size=40", "train.lr=0.002",
                           "train.batch_tokens=0", "train.sigma_floor=0.05")


@dataclass(frozen=True)
class PadRows:
    """How the engine pads a template's rows (to a multiple of `multiple`, every pad at rope position `position`),
    and how many pad rows a shard stores per sample (`stored`: 1 when every pad is the same state, 0 when the
    engine adds none)."""

    multiple: int = 1
    position: int = 1
    stored: int = 0


NO_PADS = PadRows()


def _no_taps(n_layers: int) -> tuple[int, ...]:
    raise ValueError("a LayerwisePack declares its taps_of")


@dataclass(frozen=True)
class LayerwisePack(QwenTemplatePack):
    teacher_class: str = "trainer_core.packs.common.qwen3vl.taps_teacher:TapsTeacher"
    taps_of: Callable[[int], tuple[int, ...]] = _no_taps
    pads: PadRows = NO_PADS
    family: str = ""                          # how the teacher's load note names the family
    template_rows: int = len(PREFIX_IDS) + len(SUFFIX_IDS)   # the template's own rows (the disk estimate)
    shard_meta: Mapping[str, Any] = field(default_factory=dict)   # the family's facts each shard records
    demo_layers: int = 9                      # the demo's tiny teacher (its taps are taps_of(demo_layers))
    defaults: Mapping[str, Any] = field(default_factory=lambda: LAYERWISE_DEFAULTS)
    demo_settings: tuple[str, ...] = LAYERWISE_DEMO_SETTINGS
    reference_forward: Callable[..., list[Any]] | None = layerwise_reference

    # ------------------------------------------------------------ the engine's prompt
    def student_states(self, student: Any, text: str) -> Any:
        """The rows the engine hands the adapter: the template's rows, then its pads (at their rope position)."""
        ids = student.ids(self.student_chunks(text))
        length = -(-len(ids) // self.pads.multiple) * self.pads.multiple
        batch, mask, positions = padded_batch([ids], max(length, len(ids)), self.pads.position)
        return student.hidden(batch, mask, positions)[0].cpu().numpy()

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """out_dim = the taps × the text stack's width, from the teacher's config.json (a Qwen3-VL's text_config or
        a plain Qwen3's own; the reference shapes when the teacher is mocked and not downloaded)."""
        from trainer_core.packs.lookup import material_json, resolve_material
        config = material_json(project)
        if config is None:
            return dict(self.reference_dims)
        try:
            text = config.get("text_config", config)
            layer_dim, n_layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ModelFileError(f"The teacher config in {resolve_material(project, 'teacher')} has no "
                                 f"hidden_size / num_hidden_layers; download {self.teacher_repo} again.") from None
        return {"out_dim": layer_dim * len(self.taps_of(n_layers)), "layer_dim": layer_dim, "n_layers": n_layers}

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        from trainer_core.packs.lookup import placed_teacher
        return placed_teacher(project, "teacher", device, self.teacher_class, taps_of=self.taps_of,
                              family=self.family, pad_position=self.pads.position)

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.common.qwen3vl.taps_teacher import MockTapsTeacher
        dims = self.teacher_dims(project)
        return MockTapsTeacher(dims["out_dim"], self.taps_of(dims["n_layers"]))

    # ------------------------------------------------------------ precompute
    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Layerwise layout (docs/SHARDS.md): per sample its real template rows and, with stored pads, one pad row,
        for the student and the teacher; samples sorted by length; the statistics over the rows the DiT reads."""
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        full = [student.ids(self.student_chunks(p)) for p in prompts]
        truncated = sum(len(ids) > self.max_len_student for ids in full)
        tokens = [fit_template(ids, self.max_len_student) for ids in full]
        order = sorted(range(len(prompts)), key=lambda i: len(tokens[i]))
        prompts, tokens = [prompts[i] for i in order], [tokens[i] for i in order]
        lengths = [len(t) + 1 for t in tokens]               # each sample's rows and its first pad row
        t_rows: list[Any] = []
        for batch in greedy_batches(lengths, budgets.teacher_batch, budgets.tok_budget):
            t_rows += [rows.to(torch.bfloat16) for rows in teacher.hidden([tokens[i] for i in batch])]
        q_rows: list[Any] = []
        for batch in greedy_batches(lengths, budgets.student_batch, budgets.student_tok_budget):
            ids, mask, positions = padded_batch([tokens[i] for i in batch], pad_position=self.pads.position)
            states = student.hidden(ids, mask, positions).to("cpu", torch.bfloat16)
            q_rows += [states[row, :lengths[i]].clone() for row, i in enumerate(batch)]
        taps = list(getattr(teacher, "taps", ()))
        n_real = torch.tensor([len(t) for t in tokens], dtype=torch.int32)
        tensors = {
            "ids": torch.tensor([i for ids in tokens for i in (*ids, PAD_ID)], dtype=torch.int32),
            "len": torch.tensor(lengths, dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": torch.cat(t_rows),
            "t_len": torch.tensor(lengths, dtype=torch.int32),
            "n_real": n_real,
            "pad_multiple": torch.tensor([self.pads.multiple], dtype=torch.int32),
            "n_taps": torch.tensor([len(taps)], dtype=torch.int32),
        }
        meta: dict[str, Any] = {"taps": taps}
        if self.pads.stored:
            tensors.update(target_moments(tensors["t_pack"]))    # a sample's pads weigh one row, as in the loss
            meta.update(pad_id=PAD_ID, pad_position=self.pads.position, pad_multiple=self.pads.multiple)
        else:
            tensors.update(_without_pad_rows(tensors, self.t2i_start))
            meta.update(pad_multiple=1, sup_start=self.t2i_start)
        meta.update(self.shard_meta)
        return tensors, {"prompts": prompts, "num_queries": 0, "truncated_student": truncated, "meta": meta}

    # ------------------------------------------------------------ train / export
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_layerwise", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, taps=self.taps_of(dims["n_layers"]))

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per template token, plus the stored pad rows."""
        from trainer_core.packs.estimates import prompt_tokens
        rows = self.template_rows + prompt_tokens(project, _BODY_TOKENS) + self.pads.stored
        return rows * (student_dim + dims["out_dim"]) * 2

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3-VL teacher (`demo_layers` text layers) with the real Qwen tokenizer."""
        from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
        from trainer_core.packs.lookup import resolve_material
        write_tiny_qwen3vl(resolve_material(project, "teacher"), layers=self.demo_layers)


def _without_pad_rows(tensors: dict[str, Any], sup_start: int) -> dict[str, Any]:
    """A shard's tensors without each sample's pad row (a family whose engine adds no pads), supervised from
    row `sup_start`, its statistics over those rows."""
    import torch

    from trainer_core.contract.shards import target_moments
    n_real = tensors["n_real"].long()                                        # [S]
    ends = torch.cumsum(n_real + 1, 0)                                       # one past each stored pad row
    keep = torch.ones(int(ends[-1]), dtype=torch.bool)
    keep[ends - 1] = False
    row = torch.arange(len(keep)) - torch.repeat_interleave(ends - n_real - 1, n_real + 1)   # row in sample
    t_pack = tensors["t_pack"][keep]
    return {"ids": tensors["ids"][keep], "q_pack": tensors["q_pack"][keep], "t_pack": t_pack,
            "len": n_real.int(), "t_len": n_real.int(), "pad_multiple": torch.tensor([1], dtype=torch.int32),
            **target_moments(t_pack[row[keep] >= sup_start]),                 # the rows the DiT reads
            "sup_start": torch.full((len(n_real),), sup_start, dtype=torch.int32)}
