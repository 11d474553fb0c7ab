"""The token-aligned vision packs (MageFlow-Edit, Qwen-Image 2.1): what they share.

A sample is an instruction with 0, 1 or 2 reference images (data/{train,val}.jsonl). Per sample
the shard keeps the student's rows of every real token (with vision_proj(mmproj embed) spliced
at the image slots, as the engine feeds pig_clip), the teacher's rows the pack stores, and the
raw vision rows of each image, which the adapter's vis_in reads. The packs differ in their
engine contract (`contract`: templates, reference sizes), their teacher (`tap`: the final norm of
the reduced model, or the pre-norm states of Hugging Face's full forward) and the rows they
supervise (`supervise`: every real token, or only the text rows the DiT consumes, whose teacher
rows alone are stored and measured). See packs-contract §B.2 / §B.3 and docs/SHARDS.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from trainer_core.base.errors import ModelFileError, TrainerError
from trainer_core.contract.corpus_kinds import IMAGE, CorpusKind
from trainer_core.packs.base import Budgets, Material, TrainerPack
from trainer_core.packs.common.qwen3vl.vision_data import MAX_SIDE

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["VisionPack", "VisionSession", "map_rows", "PROBES", "qwen3vl_teacher", "IMAGE_DEMO_SETTINGS", "DEMO_IMAGES",
           "TEXT_TEACHER_4B"]

PROBES = ("a sheep in sunglasses", "make it night", "", "Add snow, heavy")
TEACHER_PATTERNS = ("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors",
                    "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                    "chat_template.json")


def qwen3vl_teacher(name: str, size_hint: str, hint: str, material_id: str = "teacher", role: str = "teacher",
                    vision: bool = True) -> Material:
    """A Qwen3-VL snapshot material: Qwen/<name> under materials/<name>, titled "<name> (<role>)"; without
    `vision` the image preprocessor's config is not fetched (a pack that runs the text stack only)."""
    patterns = tuple(p for p in TEACHER_PATTERNS if vision or p != "preprocessor_config.json")
    return Material(material_id, f"{name} ({role})", "hf_snapshot", repo=f"Qwen/{name}", patterns=patterns,
                    subdir=name, size_hint=size_hint, hint=hint, model=True)


def map_rows(blocks: list[Any], weight: Any, rows_per_call: int = 8192) -> list[Any]:
    """Each block [n_i, vis_dim] through vision_proj (`weight` [in_dim, vis_dim]) in float32, in input
    order: the blocks concatenated into matmuls of up to `rows_per_call` rows and split back (one small
    matmul per image took twice the time on the CPU)."""
    import torch
    out: list[Any] = []
    group: list[Any] = []
    rows = 0
    for block in [*blocks, None]:
        if group and (block is None or rows + block.shape[0] > rows_per_call):
            out.extend((torch.cat(group).float() @ weight.T).split([b.shape[0] for b in group]))
            group, rows = [], 0
        if block is not None:
            group.append(block)
            rows += block.shape[0]
    return out


@dataclass(frozen=True)
class VisionSession:
    """What precompute fixes once per stage: vision_proj and the corpus's reference-area settings."""

    weight: Any                               # vision_proj [in_dim, vis_dim] float32
    ref_areas: Sequence[Sequence[float]] = ()
    two_image_max_area: int = 0


# Qwen3-VL-4B-Instruct for the packs that run its text stack only (FLUX.3 Klein, Krea 2)
TEXT_TEACHER_4B = qwen3vl_teacher("Qwen3-VL-4B-Instruct", "~8.3 GB", "only the text stack runs: resident it needs "
                                  "about 11 GB of GPU memory; smaller cards stream it from RAM", vision=False)

# the demo: a tiny random Qwen3-VL teacher and DEMO_IMAGES generated captioned scenes in a local folder
DEMO_IMAGES = 32
IMAGE_DEMO_SETTINGS = ("corpus.image_presets=[]", "corpus.image_folders=materials/demo_images", "corpus.n_image=64",
                       "corpus.n_two=8", "corpus.n_text=48", "corpus.n_val_image=12", "corpus.n_val_text=12",
                       "precompute.shard_size=60", "precompute.val_shard_size=24", "train.lr=0.001")
# the disk estimate's sample: ~21 tokens of caption in a text-to-image sample, ~20 of instruction in
# an edit, the merged tokens of a 384 × 384 reference image
_T2I_TEXT, _EDIT_TEXT, _IMAGE_TOKENS = 21, 20, 144


@dataclass(frozen=True)
class VisionPack(TrainerPack):
    teacher_class: str = "trainer_core.packs.common.qwen3vl.teacher:Qwen3VLTeacher"
    corpus_kind: CorpusKind = IMAGE
    reference_side: int = MAX_SIDE            # MageFlow reads references within 384²; Qwen-Image at ref_areas (0)
    contract: str = "mageflow_edit"           # "mageflow_edit" | "qwen_image_2_1"
    tap: str = "final_norm"                   # "final_norm" | "pre_norm_last_layer" (the full HF forward)
    supervise: str = "all"                    # "all" | "consumed_text"
    budget_scale: float = 1.0
    probe_counts: tuple[int, ...] = (144,)

    # ------------------------------------------------------------ contract
    def _data(self) -> Any:
        if self.contract == "qwen_image_2_1":
            from trainer_core.packs.common.qwen3vl import qwenimage_data
            return qwenimage_data
        from trainer_core.packs.common.qwen3vl import vision_data
        return vision_data

    def student_chunks(self, text: str) -> list[str]:
        """The engine's text-to-image pieces: the contract's template around the attention-parsed prompt, from the
        same `sample_chunks` precompute's `build_sample` encodes (so `infer --prompt` reads the template rows)."""
        return self._data().sample_chunks(text)

    def _preprocess(self, sample: dict[str, Any], session: VisionSession) -> list[Any]:
        data = self._data()
        images = []
        area = (data.choose_area(sample["rel"], sample["text"], session.ref_areas, session.two_image_max_area)
                if self.contract == "qwen_image_2_1" else None)
        for path in sample["images"]:
            try:
                images.append(data.preprocess(path) if area is None else data.preprocess(path, area))
            except (OSError, ValueError) as e:
                raise TrainerError(f"The reference image {path} cannot be read ({e}); reset the corpus so it is "
                                   "built again without it.") from None
        return images

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """text_config.hidden_size and vision_config.out_hidden_size of the teacher's config.json (the
        reference shapes when the teacher is mocked and not downloaded)."""
        from trainer_core.packs.lookup import material_json, resolve_material
        config = material_json(project)
        if config is None:
            return dict(self.reference_dims)
        try:
            return {"out_dim": int(config["text_config"]["hidden_size"]),
                    "vis_dim": int(config["vision_config"]["out_hidden_size"])}
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"The teacher config in {resolve_material(project, 'teacher')} is not a "
                                 "Qwen3-VL config (text_config.hidden_size, vision_config.out_hidden_size); "
                                 f"download {self.teacher_repo} again.") from None

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        if self.tap == "pre_norm_last_layer":        # the full HF forward
            from trainer_core.packs.lookup import placed_teacher
            return placed_teacher(project, "teacher", device,
                                  "trainer_core.packs.common.qwen3vl.teacher:Qwen3VLFullTeacher")
        return super().build_teacher(project, device)

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.common.qwen3vl.teacher import MockVisionTeacher
        dims = self.teacher_dims(project)
        return MockVisionTeacher(dims["out_dim"], dims["vis_dim"])

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.common.qwen3vl.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device, self.budget_scale)
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       p.student_batch or auto["student_batch"], p.student_tok_budget or auto["student_tok_budget"],
                       p.vis_tok_budget or auto["vis_tok_budget"])

    # ------------------------------------------------------------ precompute
    def prepare(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> VisionSession:
        """Check both tokenizers against the engine's templates and each other, then fit (or reuse)
        vision_proj."""
        data = self._data()
        data.check_templates(student.tokenizer, "student")
        teacher_tok = getattr(teacher, "tokenizer", None)
        if teacher_tok is not None:
            data.check_templates(teacher_tok, "teacher")
            for text in PROBES:
                two = self.probe_counts[:2] if len(self.probe_counts) > 1 else self.probe_counts * 2
                for counts in ((), self.probe_counts[:1], two):
                    a = data.build_sample(student.engine, text, counts)
                    b = data.build_sample(teacher_tok, text, counts, what="teacher")
                    if a.ids != b.ids:
                        raise ModelFileError(f"The student and teacher tokenizers disagree on {text!r} with "
                                             f"{len(counts)} image(s) ({len(a.ids)} vs {len(b.ids)} tokens); the "
                                             "adapter needs one token sequence for both: use matching snapshots.")
        c = project.settings.corpus
        return VisionSession(self._vision_proj(project, student, teacher, report), c.ref_areas, c.two_image_max_area)

    def _vision_proj(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> Any:
        import time

        import torch

        from trainer_core.packs.common.qwen3vl.vision_proj import (fit_vision_proj, load_vision_proj, safetensors_rows,
                                                            save_vision_proj, tensor_rows)
        vis_dim = getattr(teacher, "vis_dim", None) or self.teacher_dims(project)["vis_dim"]
        path = project.root / "vision_proj.pt"
        saved = load_vision_proj(path, student.hidden_size, vis_dim)
        if saved is not None:
            report("log", level="info", message=f"vision_proj reused from {path.name} "
                                                f"(fit row cos {saved.get('fit_cos_mean', float('nan')):.4f})")
            return saved["weight"]
        table = teacher.embed_table()
        student_table = student.model.embed_tokens.weight
        if table is not None:
            source = tensor_rows(table, "the teacher's embed_tokens")
        else:
            from trainer_core.packs.lookup import resolve_material
            root = resolve_material(project, "teacher")
            if (root / "model.safetensors.index.json").is_file() or any(root.glob("*.safetensors")):
                source = safetensors_rows(root)
            else:        # the mock without a downloaded teacher: a fixed random table
                g = torch.Generator().manual_seed(7)
                source = tensor_rows(torch.randn(student_table.shape[0], vis_dim, generator=g), "a random table")
        started = time.monotonic()
        report("log", level="info", message=f"fitting vision_proj on {source.rows} vocabulary rows ({source.name})")
        fit = fit_vision_proj(source, tensor_rows(student_table, "the student's embed_tokens"))
        save_vision_proj(path, fit, self.id)
        report("log", level="info",
               message=f"vision_proj fitted in {time.monotonic() - started:.1f} s: "
                       f"row cos mean {fit.fit_cos_mean:.4f}, "
                       f"5th percentile {fit.fit_cos_p5:.4f}, rel_mse {fit.rel_mse:.4g}; saved to {path.name}")
        return fit.weight

    def make_shard(self, prompts: list[Any], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Token-aligned layout (docs/SHARDS.md), samples sorted by length."""
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        from trainer_core.packs.common.qwen3vl.vision_data import merged_tokens
        data = self._data()
        weight = session.weight                                             # vision_proj [in, vis]
        images = [self._preprocess(sample, session) for sample in prompts]
        counts = [[merged_tokens(im) for im in pre] for pre in images]
        built = [data.build_sample(student.engine, s["text"], n) for s, n in zip(prompts, counts)]
        truncated = sum(len(b.ids) > self.max_len_student for b in built)
        order = sorted(range(len(prompts)), key=lambda i: len(built[i].ids))
        prompts, images, built = [prompts[i] for i in order], [images[i] for i in order], [built[i] for i in order]
        tokens = [b.ids[:self.max_len_student] for b in built]
        flat = [im for pre in images for im in pre]
        encoded = teacher.encode_images(flat, budgets.vis_tok_budget) if flat else []
        vision, k = [], 0                                     # per sample: (slot, what the teacher encoded)
        for b, pre in zip(built, images):
            vision.append([(start, encoded[k + j]) for j, (start, n) in enumerate(b.slots)
                           if start + n <= self.max_len_student])
            k += len(pre)
        rows_of = lambda v: getattr(v, "rows", v)                            # noqa: E731 — VisionOut or a tensor
        t_rows: list[torch.Tensor] = [None] * len(tokens)                   # type: ignore[list-item]
        for batch in greedy_batches([len(t) for t in tokens], budgets.teacher_batch, budgets.tok_budget):
            for i, rows in zip(batch, teacher.hidden([tokens[i] for i in batch], [vision[i] for i in batch])):
                t_rows[i] = rows.to(torch.bfloat16)
        flat_mapped = iter(map_rows([rows_of(v) for sample in vision for _, v in sample], weight))
        mapped = [[(start, next(flat_mapped)) for start, _ in sample] for sample in vision]
        q_rows = student.vision_rows(tokens, mapped, budgets.student_batch, budgets.student_tok_budget)

        stored, supervised = [], []                                         # teacher rows kept; rows in the stats
        for b, sample, rows in zip(built, vision, t_rows):
            slot = torch.zeros(rows.shape[0], dtype=torch.bool)
            for start, v in sample:
                slot[start:start + rows_of(v).shape[0]] = True
            if self.supervise == "consumed_text":                          # the DiT reads text rows from 14 on
                stored.append(rows[~slot])
                consumed = ~slot & (torch.arange(rows.shape[0]) >= b.sup_start)
                supervised.append(rows[consumed])
            else:
                stored.append(rows)
                supervised.append(rows)
        t_pack = torch.cat(stored)
        moments = target_moments(torch.cat(supervised))
        del supervised
        blocks = [(i, start, rows_of(v)) for i, sample in enumerate(vision) for start, v in sample]
        vis_dim = int(weight.shape[1])
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.tensor([r.shape[0] for r in stored], dtype=torch.int32),
            "v_pack": (torch.cat([v for _, _, v in blocks]) if blocks
                       else torch.zeros(0, vis_dim)).to(torch.bfloat16),
            "vis_sample": torch.tensor([i for i, _, _ in blocks], dtype=torch.int32),
            "vis_start": torch.tensor([s for _, s, _ in blocks], dtype=torch.int32),
            "vis_len": torch.tensor([v.shape[0] for _, _, v in blocks], dtype=torch.int32),
            "sup_start": torch.tensor([b.sup_start for b in built], dtype=torch.int32),
            "n_images": torch.tensor([len(pre) for pre in images], dtype=torch.int32),
            "t_sparse": torch.tensor([1 if self.supervise == "consumed_text" else 0], dtype=torch.int64),
            **moments,
        }
        return tensors, {"prompts": [s["text"] for s in prompts], "num_queries": 0, "truncated_student": truncated,
                         "meta": {"images": [s["rel"] for s in prompts], "tap": self.tap, "supervise": self.supervise,
                                  "vision_contract": self.contract}}

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_vision", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, vis_dim=dims["vis_dim"])

    def load_frozen(self, project: "ProjectFolder", model: Any) -> None:
        """vision_proj as precompute fitted it: frozen, the engine applies it and we never train it."""
        import torch

        from trainer_core.packs.common.qwen3vl.vision_proj import load_vision_proj
        config = model.config
        if not config.vis_dim:
            return
        saved = load_vision_proj(project.root / "vision_proj.pt", config.in_dim, config.vis_dim)
        if saved is None:
            raise TrainerError(f"{project.root / 'vision_proj.pt'} is missing or does not match this student and "
                               "teacher; precompute fits it: reset the shards and run precompute again.")
        with torch.no_grad():
            model.vision_proj.weight.copy_(saved["weight"])

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """A student and a teacher row per token of the template, text and suffix, plus the raw
        vision rows of each reference image, averaged over the corpus mix (the caption's length from the
        prompt files; a reference's slots from corpus.ref_areas where the contract renders at those areas)."""
        from trainer_core.packs.common.qwen3vl.qwenimage_data import mean_slots
        from trainer_core.packs.common.qwen3vl.vision_data import EDIT_START, HEADER_TOKENS, SUFFIX_IDS, T2I_START
        c = project.settings.corpus
        row = (student_dim + dims["out_dim"]) * 2
        from trainer_core.packs.estimates import prompt_tokens
        t2i_rows = T2I_START + prompt_tokens(project, _T2I_TEXT) + len(SUFFIX_IDS)    # 34 + ~21 + 5
        edit_rows = EDIT_START + HEADER_TOKENS + 1 + _EDIT_TEXT            # 64 + 7 + 20
        samples = c.n_image + c.n_two + c.n_text + c.n_val_image + c.n_val_text
        one, two = _IMAGE_TOKENS, _IMAGE_TOKENS
        if self.contract == "qwen_image_2_1" and c.ref_areas:
            capped = [(a, w) for a, w in c.ref_areas if a <= c.two_image_max_area] or [min(c.ref_areas)]
            one, two = mean_slots(c.ref_areas, _IMAGE_TOKENS), mean_slots(capped, _IMAGE_TOKENS)
        edits, image_rows = c.n_image + c.n_val_image + c.n_two, (c.n_image + c.n_val_image) * one + 2 * c.n_two * two
        return ((c.n_text + c.n_val_text) * t2i_rows * row + edits * edit_rows * row
                + image_rows * (row + dims["vis_dim"] * 2)) / max(samples, 1)

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3-VL teacher and generated captioned scenes under materials/demo_images."""
        from trainer_core.packs.common.tiny_models import write_demo_images
        from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
        from trainer_core.packs.lookup import resolve_material
        write_tiny_qwen3vl(resolve_material(project, "teacher"))
        write_demo_images(project.materials_dir / "demo_images", DEMO_IMAGES)
