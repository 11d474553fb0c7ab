"""Krea 2 (and Iris-3B with the same file): Qwen3-VL-4B-Instruct layers 2, 5, …, 35 stacked → pig_clip + a
12-tap layerwise adapter.

The DiT reads, per row of the MageFlow text-to-image template from row 34 on, the teacher's hidden states
of 12 intermediate layers side by side (12 × 2560 = 30720); its text fusion runs across the 12 layers. The
engine adds no pads, so a shard keeps each sample's real rows only and names row 34 as where supervision
starts: the adapter runs over the system turn, whose rows weigh 0 (template.py; engine-adapter-families
§1.2). The layerwise family (common/layerwise.py) does the rest at these taps.

Iris-3B reuses the adapter: same template and taps, the caption capped at 300 tokens. The corpus keeps
its prompts inside that cap (a longer prompt's body is cut as Iris cuts it), and the Output tab prints
both engine commands. The engine's notes cite val cos 0.948 for a 12-tap run of this recipe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_core.packs.base import STUDENT_MATERIALS, EngineFacts, ExportContents
from trainer_core.packs.common.flux3_klein import tap_text
from trainer_core.packs.common.layerwise import NO_PADS, LayerwisePack
from trainer_core.packs.common.qwen3vl.vision_pack import TEXT_TEACHER_4B
from trainer_core.packs.qwen3vl_krea2.template import (IRIS_CAPTION_CAP, MAX_ROWS, SUFFIX, SUFFIX_IDS, SYSTEM_ROWS,
                                                       T2I_PREFIX, TAPS, check_template, taps_for, template_chunks)
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["PACK", "Krea2Pack"]

LAYER_DIM, N_LAYERS = 2560, 36           # Qwen3-VL-4B's text stack: the reference shapes



def _target(taps: tuple[int, ...], out_dim: int) -> str:
    return (f"krea2 / iris text conditioning (Qwen3-VL-4B-Instruct hidden_states {','.join(map(str, taps))} "
            f"stacked, {out_dim} per template token from row {SYSTEM_ROWS} on)")


@dataclass(frozen=True)
class Krea2Pack(LayerwisePack):
    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        return ExportContents(kvs={**self.export_kvs, "adapter.target": _target(config.taps, config.out_dim)})

    def ggk_command(self, project: "ProjectFolder") -> str:
        """Krea 2 Turbo, then Iris-3B (pixel space: no VAE) with the same adapter."""
        krea = super().ggk_command(project)
        iris = krea.replace(self.ggk_model_args, "--diffusion-model iris-3b-f16.gguf").replace(
            "--cfg-scale 1 --steps 4", "--cfg-scale 3")
        return krea + "\n" + iris


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
    default_folder="qwen3vl_4b_krea2_adapter",
    shard_contract="qwen3vl_krea2/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    chunks=template_chunks,
    check_template=check_template,
    taps_of=taps_for,
    pads=NO_PADS,
    family="Krea 2",
    template_rows=SYSTEM_ROWS + len(SUFFIX_IDS),
    shard_meta={"caption_cap": IRIS_CAPTION_CAP},
    demo_layers=N_LAYERS,
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": tap_text(TAPS),
        "adapter.target": _target(TAPS, LAYER_DIM * len(TAPS)),
        "adapter.supervised_rows": f"template rows from {SYSTEM_ROWS}",
        "adapter.student_prompt": "mageflow_t2i_template",
    },
    ggk_min_version="0.9.7",
    t2i_template=T2I_PREFIX + "{text}" + SUFFIX,
    t2i_start=SYSTEM_ROWS,
    max_len_student=MAX_ROWS,
    materials=STUDENT_MATERIALS + (TEXT_TEACHER_4B,),
    metric_names=("cos", "cos_centered", "cos_raw", "cos_full", "rel_mse", "worst_sample_cos", "roundtrip_cos",
                  "trained_steps", "val_samples"),
    engine=EngineFacts(versions=("krea2", "iris"), teacher="qwen3_vl"),
    ggk_model_args="--diffusion-model krea2-turbo-nvfp4.gguf --vae krea2-vae-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --cfg-scale 1 --steps 4 --sampling-method euler --diffusion-fa",
    reference_dims={"out_dim": LAYER_DIM * len(TAPS), "layer_dim": LAYER_DIM, "n_layers": N_LAYERS},
    judge=EvalGuide(
        headline="cos", also=("rel_mse",),
        good="cos is the per-tap standardized cosine training reports as val cos; the published 12-tap Krea 2 run "
             "reached 0.948",
        references=(("cos", "0.948"),),
        source="gguf-trainer 0.0.14's pack hint (the published package, PyPI): \"the krea2 12-tap run reached val "
               "cos 0.948\"; a training-val cosine, what eval.json's cos measures"),
)
