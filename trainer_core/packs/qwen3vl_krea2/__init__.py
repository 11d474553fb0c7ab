"""Krea 2 (and Iris-3B with the same file): Qwen3-VL-4B-Instruct layers 2, 5, …, 35 stacked → pig_clip + a
12-tap layerwise adapter.

The DiT reads, per row of the MageFlow text-to-image template from row 34 on, the teacher's hidden states
of 12 intermediate layers side by side (12 × 2560 = 30720); its text fusion runs across the 12 layers. The
engine adds no pads, so a shard keeps each sample's real rows only (`pad_multiple` 1) and names row 34 as
where supervision starts (`sup_start`): the adapter runs over the system turn, whose rows weigh 0
(template.py; engine-adapter-families §1.2). The FLUX.3 Klein pack's machinery does the rest: the same
teacher with other taps, the same kind, per-tap loss and export fold.

Iris-3B reuses the adapter: same template and taps, the caption capped at 300 tokens. The corpus keeps
its prompts inside that cap (a longer prompt's body is cut as Iris cuts it), and the Output tab prints
both engine commands. The engine's notes cite val cos 0.948 for a 12-tap run of this recipe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.base import Budgets
from trainer_core.packs.qwen3vl_flux3 import PACK as FLUX3
from trainer_core.packs.qwen3vl_flux3 import Flux3Pack
from trainer_core.packs.qwen3vl_flux3.template import padded_batch
from trainer_core.packs.qwen3vl_krea2.template import (IRIS_CAPTION_CAP, MAX_ROWS, SUFFIX, SUFFIX_IDS, SYSTEM_ROWS,
                                                       T2I_PREFIX, TAPS, fit_caption, taps_for, template_chunks)
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "Krea2Pack"]

LAYER_DIM, N_LAYERS = 2560, 36           # Qwen3-VL-4B's text stack: the reference shapes
_BODY_TOKENS = 60                        # the disk estimate's prompt without prompt files: ~60 tokens of body


def _target(taps: tuple[int, ...], out_dim: int) -> str:
    return (f"krea2 / iris text conditioning (Qwen3-VL-4B-Instruct hidden_states {','.join(map(str, taps))} "
            f"stacked, {out_dim} per template token from row {SYSTEM_ROWS} on)")


@dataclass(frozen=True)
class Krea2Pack(Flux3Pack):
    teacher_class = "trainer_core.packs.qwen3vl_krea2.teacher:Krea2Teacher"
    taps_of = staticmethod(taps_for)        # the Klein pack's dims, mock and adapter config at these taps

    def student_chunks(self, text: str) -> list[str]:
        return template_chunks(text)

    def template_ids(self, student: Any, text: str) -> list[int]:
        """The engine's ids for a prompt, its caption cut to Iris' 300 tokens (the marker kept)."""
        return fit_caption(student.ids(self.student_chunks(text)), self.max_len_student)

    def engine_ids(self, student: Any, text: str) -> list[int]:
        """The template's ids, no pads."""
        return student.ids(self.student_chunks(text))

    def student_states(self, student: Any, text: str) -> Any:
        """The rows the engine hands the adapter: the template's rows, no pads."""
        ids = student.ids(self.student_chunks(text))
        return student.hidden(*padded_batch([ids], len(ids)))[0].cpu().numpy()

    # ------------------------------------------------------------ precompute
    def check_tokenizer(self, encode: Callable[[str], Any], what: str) -> None:
        """Refuse a tokenizer whose system turn and user header are not the 34 rows the engine drops, or whose
        assistant marker is not the engine's ids (FLUX.3 Klein's prepare then compares both tokenizers)."""
        rows, marker = len(encode(T2I_PREFIX)), tuple(encode(SUFFIX))
        if rows != SYSTEM_ROWS or marker != SUFFIX_IDS:
            raise ModelFileError(f"The {what} tokenizer gives the Krea 2 template's system turn {rows} tokens and its "
                                 f"marker {list(marker)}; the engine's are {SYSTEM_ROWS} and {list(SUFFIX_IDS)}: use "
                                 "the Qwen tokenizer of the snapshot.")

    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Layerwise layout without pads (docs/SHARDS.md): the FLUX.3 Klein shard of the same samples (cut to
        Iris' caption) without each sample's pad row, supervised from row 34; statistics over those rows."""
        import torch

        from trainer_core.contract.shards import target_moments
        tensors, extra = super().make_shard(prompts, student, teacher, budgets, session)
        n_real = tensors["n_real"].long()                                        # [S]
        ends = torch.cumsum(n_real + 1, 0)                                       # one past each stored pad row
        keep = torch.ones(int(ends[-1]), dtype=torch.bool)
        keep[ends - 1] = False
        row = torch.arange(len(keep)) - torch.repeat_interleave(ends - n_real - 1, n_real + 1)   # row in sample
        t_pack = tensors["t_pack"][keep]
        for name in ("ids", "q_pack"):
            tensors[name] = tensors[name][keep]
        tensors.update(t_pack=t_pack, len=n_real.int(), t_len=n_real.int(),
                       pad_multiple=torch.tensor([1], dtype=torch.int32),
                       sup_start=torch.full((len(n_real),), SYSTEM_ROWS, dtype=torch.int32),
                       **target_moments(t_pack[row[keep] >= SYSTEM_ROWS]))        # the rows the DiT reads
        meta = extra["meta"]
        for key in ("pad_id", "pad_position"):
            meta.pop(key)
        meta.update(pad_multiple=1, sup_start=SYSTEM_ROWS, caption_cap=IRIS_CAPTION_CAP)
        return tensors, extra

    # ------------------------------------------------------------ train / export
    def adapter_kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        return {**self.export_kvs, "adapter.target": _target(config.taps, config.out_dim)}

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per template token (34 + ~60 + 5)."""
        rows = SYSTEM_ROWS + self.prompt_tokens(project, _BODY_TOKENS) + len(SUFFIX_IDS)
        return rows * (student_dim + dims["out_dim"]) * 2

    def ggk_command(self, project: "ProjectFolder") -> str:
        """Krea 2 Turbo, then Iris-3B (pixel space: no VAE) with the same adapter."""
        krea = super().ggk_command(project)
        iris = krea.replace(self.ggk_model_args, "--diffusion-model iris-3b-f16.gguf").replace(
            "--cfg-scale 1 --steps 4", "--cfg-scale 3")
        return krea + "\n" + iris

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3-VL teacher with the real depth (36 text layers: taps 2 … 35) and the real Qwen
        tokenizer."""
        from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
        write_tiny_qwen3vl(self.resolve_material(project, "teacher"), layers=N_LAYERS)


PACK = Krea2Pack(
    id="qwen3vl_krea2",
    order=45,
    demo_order=9,
    title="Krea 2 / Iris-3B (Qwen3-VL-4B-Instruct layers 2…35 → 12-tap layerwise)",
    description=(
        "Replaces the Qwen3-VL-4B-Instruct text encoder of Krea 2 Turbo — and of Iris-3B, which taps it the same "
        "way — with pig_clip and a token-aligned layerwise adapter: every row of the MageFlow text-to-image "
        "template from row 34 on becomes the teacher's hidden states of layers 2, 5, …, 35 side by side "
        "(12 × 2560 = 30720). No pads; prompts are kept within Iris' 300-token caption. Needs ggk 0.9.7 or later."
    ),
    adapter_kind="token_aligned_layerwise",
    corpus_kind="text",
    default_folder="qwen3vl_4b_krea2_adapter",
    shard_contract="qwen3vl_krea2/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    defaults=FLUX3.defaults,
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": f"layers {','.join(map(str, TAPS))} (hidden_states[k], stacked ascending)",
        "adapter.target": _target(TAPS, LAYER_DIM * len(TAPS)),
        "adapter.supervised_rows": f"template rows from {SYSTEM_ROWS}",
        "adapter.student_prompt": "mageflow_t2i_template",
    },
    ggk_min_version="0.9.7",
    t2i_template=T2I_PREFIX + "{text}" + SUFFIX,
    t2i_start=SYSTEM_ROWS,
    max_len_student=MAX_ROWS,
    materials=FLUX3.materials,
    metric_names=("cos", "cos_centered", "cos_raw", "cos_full", "rel_mse", "worst_sample_cos", "roundtrip_cos",
                  "trained_steps", "val_samples"),
    engine_versions=("krea2", "iris"),
    ggk_model_args="--diffusion-model krea2-turbo-nvfp4.gguf --vae krea2-vae-f16.gguf",
    ggk_args=FLUX3.ggk_args,
    reference_dims={"out_dim": LAYER_DIM * len(TAPS), "layer_dim": LAYER_DIM, "n_layers": N_LAYERS},
    demo_settings=FLUX3.demo_settings,
    judge=EvalGuide(
        headline="cos", also=("rel_mse",),
        good="cos is the per-tap standardized cosine training reports as val cos; the trainer6 12-tap run reached "
             "0.948",
        references=(("cos", "0.948"),),
        source="the engine's notes: \"the krea2 12-tap trainer6 run reached val cos 0.948\" "
               "(engine-adapter-families.md §1.2, quoting packs-contract-more.md D.3 §8); a training-val cosine, "
               "what eval.json's cos measures"),
)
