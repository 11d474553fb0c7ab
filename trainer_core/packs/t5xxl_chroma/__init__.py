"""Chroma (Chroma1-HD and its kin): the 4.7B T5-XXL v1.1 encoder → pig_clip + a 512-query resampler seeded
with T5 ids.

ggk 0.9.7 gives Chroma DiTs its T5CLIPEmbedder, which takes `--llm pig_clip --llm-adapter X` in place of T5
(conditioning/conditioner.hpp:1193-1506; engine-adapter-families §1.5). The
student reads the raw prompt (no template, as PixArt's); the adapter's query i is seeded with the T5
embedding of slot i of the engine's 512-slot window (template.py). The teacher is PixArt's (the same
snapshot) run the way the engine runs T5 for Chroma: over the whole window with no key mask (teacher.py).
Per prompt the targets are the rows the DiT reads: the real slots, EOS and the first pad slot.

Evaluation: eval.json's `cos`, `cos_rms`, `rel_mse` and `worst_row_cos` are over those supervised rows.
Its `cos_eos` is the cosine at the last supervised slot, which for this pack is the first pad slot (EOS
only when the window is full), so the pack does not list it among its metrics under that name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainer_core.packs.base import Budgets
from trainer_core.packs.common.t5 import T5_VOCAB, T5_WIDTH, T5EncoderPack
from trainer_core.packs.t5xxl_chroma.template import CHROMA_WINDOW
from trainer_core.packs.t5xxl_pixart import PACK as PIXART     # the same teacher snapshot and defaults
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "ChromaPack"]


@dataclass(frozen=True)
class ChromaPack(T5EncoderPack):
    """T5EncoderPack over Chroma's window: 512 queries, the unmasked teacher and its supervised rows."""

    teacher_class = "trainer_core.packs.t5xxl_chroma.teacher:ChromaTeacher"

    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """d_model and vocab_size of the teacher's config.json (the reference shapes when the teacher is mocked
        and not downloaded), and the 512 queries of the engine's window."""
        return {**super().teacher_dims(project), "num_queries": CHROMA_WINDOW}

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.t5xxl_chroma.teacher import MockChromaTeacher
        dims = self.teacher_dims(project)
        return MockChromaTeacher(dims["out_dim"], dims["seed_vocab"])

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        """The T5 budgets, with teacher_batch cut so that a batch's full windows fit tok_budget: the unmasked
        teacher runs all 512 slots of every prompt, however few it keeps."""
        b = super().budgets(project, device)
        return replace(b, teacher_batch=max(1, min(b.teacher_batch, b.tok_budget // CHROMA_WINDOW)))


PACK = ChromaPack(
    id="t5xxl_chroma",
    order=75,
    demo_order=8,
    title="Chroma (T5-XXL v1.1 → 512-query seeded resampler)",
    description=(
        "Replaces the 4.7B T5-XXL v1.1 encoder of Chroma (Chroma1-HD and its kin) with pig_clip and a "
        "512-query resampler whose queries are seeded with the T5 sentencepiece embedding of their slot in "
        "the engine's 512-slot window. The T5 tokenizer stays at inference; the encoder is never loaded. "
        "Targets are T5's last_hidden_state over the whole window with no mask, as the engine runs it for "
        "Chroma, at the slots its DiT reads: the real slots, EOS and the first pad (~40 rows × 4096 a prompt)."
    ),
    adapter_kind="seeded_resampler",
    corpus_kind="text",
    default_folder="t5_chroma_adapter",
    shard_contract="t5xxl_chroma/1",
    teacher_repo="callgg/t5-v1_1-xxl-encoder-bf16",
    defaults=PIXART.defaults,
    export_kvs={**PIXART.export_kvs,
                "adapter.target": ("chroma: t5_v1_1_xxl encoder last_hidden_state, unmasked 512-slot window "
                                   "(real slots, EOS and the first pad)")},
    max_len_student=512,
    reference_dims={"out_dim": T5_WIDTH, "num_queries": CHROMA_WINDOW, "seed_vocab": T5_VOCAB},
    materials=PIXART.materials,
    metric_names=("cos", "cos_rms", "rel_mse", "worst_row_cos", "roundtrip_cos", "trained_steps", "val_batches"),
    engine_versions=("chroma",),
    ggk_model_args="--diffusion-model chroma1-hd-Q8_0.gguf --vae ae.safetensors",
    ggk_args="--llm {student} --llm-adapter {gguf}",
    judge=EvalGuide(
        headline="cos", also=("rel_mse",),
        good="cos over the rows the DiT reads (real slots, EOS, the first pad slot); PixArt, with the same teacher "
             "and student, plateaus at 0.80–0.83, a guide and not a Chroma figure",
        source="none: engine-adapter-families.md §1.5 names no reference run"),
)
