"""FLUX.3 Klein: Qwen3-VL-4B-Instruct layers 4 … 32 stacked → pig_clip + a layerwise adapter.

The DiT reads, per row of its chat template (padded to a multiple of 80), the teacher's hidden states of 8
intermediate layers side by side (8 × 2560 = 20480). pig_clip shares the Qwen BPE, so it runs the teacher's
exact ids, positions and mask, and a token-aligned layerwise adapter maps each student row to the teacher's
stack at the same row (common/flux3_klein.py; packs-contract-more §D.3). The family's machinery is
common/layerwise.py; what is this pack's own is its declaration and the KVs naming its taps.

Shards keep each sample's real rows and ONE pad row (all its pads are that state); the reader repeats it up to
the multiple of 80 with weight 1/n_pad. Targets are standardized with a per-tap relative σ floor and folded
back at export (out_proj and skip).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_core.packs.base import STUDENT_MATERIALS, EngineFacts, ExportContents
from trainer_core.packs.common.flux3_klein import PAD_MULTIPLE, PAD_POSITION, TAPS, tap_text, taps_for
from trainer_core.packs.common.layerwise import LayerwisePack, PadRows
from trainer_core.packs.common.qwen_chat import PREFIX, SUFFIX
from trainer_core.packs.common.qwen3vl.vision_pack import TEXT_TEACHER_4B
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["PACK", "Flux3Pack"]

LAYER_DIM, N_LAYERS = 2560, 36           # Qwen3-VL-4B's text stack: the reference shapes



@dataclass(frozen=True)
class Flux3Pack(LayerwisePack):
    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        """The pack's KVs, the tap description from the trained taps."""
        return ExportContents(kvs={
            **self.export_kvs, "adapter.teacher_tap": tap_text(config.taps),
            "adapter.target": (f"flux3 klein text conditioning (Qwen3-VL-4B-Instruct layers "
                               f"{config.taps[0]}..{config.taps[-1]}, {config.out_dim} per template token)")})


PACK = Flux3Pack(
    id="qwen3vl_flux3",
    order=40,
    demo_order=5,
    title="FLUX.3 Klein (Qwen3-VL-4B-Instruct layers 4…32 → layerwise)",
    description=(
        "Replaces the Qwen3-VL-4B-Instruct text encoder of FLUX.3 Image Klein with pig_clip and a "
        "token-aligned layerwise adapter: every row of the chat template (padded to a multiple of 80) "
        "becomes the teacher's hidden states of layers 4, 8, …, 32 side by side (8 × 2560 = 20480). "
        "Text-only; reference images go to the DiT through the VAE. Needs ggk 0.9.5 or later."
    ),
    adapter_kind="token_aligned_layerwise",
    default_folder="qwen3vl_4b_it_adapter",
    shard_contract="qwen3vl_flux3/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    taps_of=taps_for,
    pads=PadRows(multiple=PAD_MULTIPLE, position=PAD_POSITION, stored=1),
    family="FLUX.3 Klein",
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": tap_text(TAPS),
        "adapter.target": "flux3 klein text conditioning (Qwen3-VL-4B-Instruct layers 4..32, 20480 per template token)",
        "adapter.pad_multiple": PAD_MULTIPLE,
        "adapter.pad_position": PAD_POSITION,
        "adapter.student_prompt": "flux3_template",
    },
    ggk_min_version="0.9.5",
    t2i_template=PREFIX + "{text}" + SUFFIX,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEXT_TEACHER_4B,),
    metric_names=("cos", "cos_tokens", "cos_pads", "cos_dit", "cos_centered", "cos_raw", "cos_full", "rel_mse",
                  "worst_sample_cos", "roundtrip_cos", "trained_steps", "val_samples"),
    engine=EngineFacts(versions=("flux3",), pad_multiple=PAD_MULTIPLE, teacher="qwen3_vl"),
    ggk_model_args="--diffusion-model flux3-image-klein-nvfp4.gguf --vae pig_flux2_vae_fp32-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --cfg-scale 1 --steps 4 --sampling-method euler --diffusion-fa",
    reference_dims={"out_dim": LAYER_DIM * len(TAPS), "layer_dim": LAYER_DIM, "n_layers": N_LAYERS},
    judge=EvalGuide(
        headline="cos", also=("cos_tokens", "cos_pads", "rel_mse"),
        good="cos is the per-tap standardized cosine training reports as val cos; cos_tokens and cos_pads split "
             "the real rows from the pad rows",
        source="none is published for FLUX.3 Klein: gguf-trainer 0.0.14's pack hint (PyPI) quotes another model's "
               "run (Krea 2's 12-tap run, val cos 0.948) and says to expect ~0.9"),
)
