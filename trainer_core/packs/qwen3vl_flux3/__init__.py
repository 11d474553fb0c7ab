"""FLUX.3 Image Klein: Qwen3-VL-4B-Instruct layers 4 … 32 stacked → pig_clip + a layerwise adapter.

The DiT reads, per row of its chat template (padded to a multiple of 80), the teacher's hidden
states of 8 intermediate layers side by side (8 × 2560 = 20480). pig_clip shares the Qwen BPE, so
it runs the teacher's exact ids, positions and mask, and a token-aligned layerwise adapter maps each
student row to the teacher's stack at the same row (template.py; packs-contract-more §D.3).

Shards keep each sample's real rows and ONE pad row (all its pads are that state); the reader
repeats it up to the multiple of 80 with weight 1/n_pad. Targets are standardized with a per-tap
relative σ floor and folded back at export (out_proj and skip).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, TrainerPack
from trainer_core.packs.common.qwen3vl.vision_pack import qwen3vl_teacher
from trainer_core.packs.qwen3vl_flux3.template import (PAD_ID, PAD_MULTIPLE, PAD_POSITION, PREFIX, PREFIX_IDS, SUFFIX,
                                                       SUFFIX_IDS, TAPS, check_templates, fit_template, padded_batch,
                                                       padded_length, taps_for)
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "Flux3Pack", "TEACHER"]

LAYER_DIM, N_LAYERS = 2560, 36           # Qwen3-VL-4B's text stack: the reference shapes
PROBES = ("a sheep in sunglasses", "", "Add snow, heavy", "  leading spaces\nand a newline", "café ☕ 日本語")
_BODY_TOKENS = 60                        # the disk estimate's prompt without prompt files: ~60 tokens of body

TEACHER = qwen3vl_teacher("Qwen3-VL-4B-Instruct", "~8.3 GB", "only the text stack runs: resident it needs about 11 GB "
                          "of GPU memory; smaller cards stream it from RAM", vision=False)


def _tap_text(taps: tuple[int, ...]) -> str:
    return f"layers {','.join(map(str, taps))} (hidden_states[k], stacked ascending)"


@dataclass(frozen=True)
class Flux3Pack(TrainerPack):
    teacher_class = "trainer_core.packs.qwen3vl_flux3.teacher:KleinTeacher"
    taps_of: ClassVar[Callable[[int], tuple[int, ...]]] = staticmethod(taps_for)   # the taps of an n-layer teacher
    budget_scale: float = 0.5

    def student_chunks(self, text: str) -> list[str]:
        """PREFIX | the prompt, attention-parsed | SUFFIX, each tokenized on its own (the empty prompt:
        the two template pieces)."""
        body = [chunk for chunk, _ in parse_prompt_attention(text)] if text else []
        return [PREFIX, *body, SUFFIX]

    def template_ids(self, student: Any, text: str) -> list[int]:
        """The engine's ids for a prompt, cut to max_len_student rows (the suffix kept)."""
        return fit_template(student.ids(self.student_chunks(text)), self.max_len_student)

    def engine_ids(self, student: Any, text: str) -> list[int]:
        """The template's ids, then the pad id up to a multiple of 80 (the rows student_states runs)."""
        ids = student.ids(self.student_chunks(text))
        return ids + [PAD_ID] * (max(padded_length(len(ids)), len(ids)) - len(ids))

    def student_states(self, student: Any, text: str) -> Any:
        """The rows the engine hands the adapter: the template's rows, then pads up to a multiple of 80."""
        ids = student.ids(self.student_chunks(text))
        batch, mask, positions = padded_batch([ids], max(padded_length(len(ids)), len(ids)))
        return student.hidden(batch, mask, positions)[0].cpu().numpy()

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """out_dim = 8 taps × the text stack's width, from the teacher's config.json (the reference shapes
        when the teacher is mocked and not downloaded)."""
        config = self.material_json(project)
        if config is None:
            return dict(self.reference_dims)
        try:
            text = config["text_config"]
            layer_dim, n_layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"The teacher config in {self.resolve_material(project, 'teacher')} has no "
                                 f"text_config.hidden_size / num_hidden_layers; download {self.teacher_repo} "
                                 "again.") from None
        return {"out_dim": layer_dim * len(self.taps_of(n_layers)), "layer_dim": layer_dim, "n_layers": n_layers}

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.qwen3vl_flux3.teacher import MockKleinTeacher
        dims = self.teacher_dims(project)
        return MockKleinTeacher(dims["out_dim"], self.taps_of(dims["n_layers"]))

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.common.qwen3vl.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device, self.budget_scale)
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       p.student_batch or auto["student_batch"], p.student_tok_budget or auto["student_tok_budget"])

    # ------------------------------------------------------------ precompute
    def prepare(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> None:
        """Both tokenizers give the engine's template ids, and the teacher's own encoding of the whole
        template string equals the student's piecewise one on the probes."""
        self.check_tokenizer(student.tokenize, "student")
        tok = getattr(teacher, "tokenizer", None)
        if tok is None:
            return
        self.check_tokenizer(lambda s: tok.encode(s, add_special_tokens=False).ids, "teacher")
        for text in PROBES:
            mine = student.ids(self.student_chunks(text))
            theirs = tok.encode(self.format_prompt(text), add_special_tokens=False).ids
            if mine != theirs:
                raise ModelFileError(f"The student and teacher tokenizers disagree on {text!r} ({len(mine)} vs "
                                     f"{len(theirs)} tokens); the adapter needs one token sequence for both: use "
                                     "matching snapshots.")

    def check_tokenizer(self, encode: Callable[[str], Any], what: str) -> None:
        """Refuse a tokenizer (`encode(text) -> ids`) that does not give the engine's template pieces."""
        check_templates(encode, what)

    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Layerwise layout (docs/SHARDS.md): per sample its n_real template rows and one pad row, for the
        student and the teacher; samples sorted by length."""
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        full = [student.ids(self.student_chunks(p)) for p in prompts]
        truncated = sum(len(ids) > self.max_len_student for ids in full)
        tokens = [fit_template(ids, self.max_len_student) for ids in full]
        order = sorted(range(len(prompts)), key=lambda i: len(tokens[i]))
        prompts, tokens = [prompts[i] for i in order], [tokens[i] for i in order]
        lengths = [len(t) + 1 for t in tokens]
        t_rows: list[Any] = []
        for batch in greedy_batches(lengths, budgets.teacher_batch, budgets.tok_budget):
            t_rows += [rows.to(torch.bfloat16) for rows in teacher.hidden([tokens[i] for i in batch])]
        q_rows: list[Any] = []
        for batch in greedy_batches(lengths, budgets.student_batch, budgets.student_tok_budget):
            ids, mask, positions = padded_batch([tokens[i] for i in batch])
            states = student.hidden(ids, mask, positions).to("cpu", torch.bfloat16)
            q_rows += [states[row, :lengths[i]].clone() for row, i in enumerate(batch)]
        t_pack = torch.cat(t_rows)
        n_taps = len(getattr(teacher, "taps", TAPS))
        tensors = {
            "ids": torch.tensor([i for ids in tokens for i in (*ids, PAD_ID)], dtype=torch.int32),
            "len": torch.tensor(lengths, dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.tensor(lengths, dtype=torch.int32),
            "n_real": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "pad_multiple": torch.tensor([PAD_MULTIPLE], dtype=torch.int32),
            "n_taps": torch.tensor([n_taps], dtype=torch.int32),
            **target_moments(t_pack),        # the stored rows: a sample's pads weigh one row, as in the loss
        }
        return tensors, {"prompts": prompts, "num_queries": 0, "truncated_student": truncated,
                         "meta": {"taps": list(getattr(teacher, "taps", TAPS)), "pad_id": PAD_ID,
                                  "pad_position": PAD_POSITION, "pad_multiple": PAD_MULTIPLE}}

    # ------------------------------------------------------------ train / export
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_layerwise", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, taps=self.taps_of(dims["n_layers"]))

    def adapter_kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        """The pack's KVs, the tap description from the trained taps."""
        return {**self.export_kvs, "adapter.teacher_tap": _tap_text(config.taps),
                "adapter.target": (f"flux3 klein text conditioning (Qwen3-VL-4B-Instruct layers "
                                   f"{config.taps[0]}..{config.taps[-1]}, {config.out_dim} per template token)")}

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per template token plus the one pad row."""
        rows = len(PREFIX_IDS) + self.prompt_tokens(project, _BODY_TOKENS) + len(SUFFIX_IDS) + 1
        return rows * (student_dim + dims["out_dim"]) * 2

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3-VL teacher (9 text layers: taps 1 … 8) with the real Qwen tokenizer."""
        from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
        write_tiny_qwen3vl(self.resolve_material(project, "teacher"), layers=9)


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
    corpus_kind="text",
    default_folder="qwen3vl_4b_it_adapter",
    shard_contract="qwen3vl_flux3/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    defaults={
        "corpus": {"presets": ["gustavosta", "midjourney"], "n_train": 30000, "n_val": 1024, "empty_frac": 0.01,
                   "min_chars": 8, "max_chars": 1200},
        "precompute": {"shard_size": 512, "val_shard_size": 256, "teacher_batch": 0, "tok_budget": 0,
                       "student_batch": 0, "student_tok_budget": 0, "teacher_mode": "auto"},
        "train": {"width": 1024, "depth": 4, "steps": 20000, "batch_size": 32, "sigma_floor": 0.05,
                  "batch_tokens": 8192},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": _tap_text(TAPS),
        "adapter.target": "flux3 klein text conditioning (Qwen3-VL-4B-Instruct layers 4..32, 20480 per template token)",
        "adapter.pad_multiple": PAD_MULTIPLE,
        "adapter.pad_position": PAD_POSITION,
        "adapter.student_prompt": "flux3_template",
    },
    ggk_min_version="0.9.5",
    t2i_template=PREFIX + "{text}" + SUFFIX,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos", "cos_tokens", "cos_pads", "cos_dit", "cos_centered", "cos_raw", "cos_full", "rel_mse",
                  "worst_sample_cos", "roundtrip_cos", "trained_steps", "val_samples"),
    engine_versions=("flux3",),
    ggk_model_args="--diffusion-model flux3-image-klein-nvfp4.gguf --vae pig_flux2_vae_fp32-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --cfg-scale 1 --steps 4 --sampling-method euler --diffusion-fa",
    reference_dims={"out_dim": LAYER_DIM * len(TAPS), "layer_dim": LAYER_DIM, "n_layers": N_LAYERS},
    demo_settings=("precompute.shard_size=120", "precompute.val_shard_size=40", "train.lr=0.002",
                   "train.batch_tokens=0", "train.sigma_floor=0.05"),
    judge=EvalGuide(
        headline="cos", also=("cos_tokens", "cos_pads", "rel_mse"),
        good="cos is the per-tap standardized cosine training reports as val cos; cos_tokens and cos_pads split "
             "the real rows from the pad rows",
        source="none for FLUX.3 Klein: the peer's hint quotes another model's run (Krea 2's 12-tap trainer6 run, "
               "val cos 0.948) and says to expect ~0.9 (packs-contract-more.md D.3 §8)"),
)
