"""MageFlow-Edit: the Qwen3-VL-4B-Instruct text stack → pig_clip + a token-aligned vision adapter.

A sample is an instruction with 0, 1 or 2 reference images (data/{train,val}.jsonl). Per sample
the shard keeps every real token's teacher row (final norm), the student's rows (with
vision_proj(mmproj embed) spliced at the image slots, as the engine feeds pig_clip), and the raw
vision rows of each image, which the adapter's vis_in reads (packs-contract §B.2, vision_data).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelFileError, TrainerError
from .base import STUDENT_MATERIALS, Budgets, Material, TrainerPack

if TYPE_CHECKING:
    from ..adapter import AdapterConfig
    from ..project import Project

# the reference shapes (Qwen3-VL-4B): text hidden and the vision merger's output
OUT_DIM, VIS_DIM = 2560, 2560
BUDGET_SCALE = 1.0
PROBES = ("a sheep in sunglasses", "make it night", "", "Add snow, heavy")

TEACHER = Material("teacher", "Qwen3-VL-4B-Instruct (teacher)", "hf_snapshot", repo="Qwen/Qwen3-VL-4B-Instruct",
                   patterns=("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors",
              "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
              "chat_template.json"),
                   subdir="Qwen3-VL-4B-Instruct", size_hint="~8.3 GB")

EDIT_PREFIX = (  # 64 tokens
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
T2I_PREFIX = (  # 34 tokens
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"  # 5 tokens

@dataclass(frozen=True)
class MageFlowPack(TrainerPack):

    def _teacher_config(self, project: "Project") -> dict[str, Any] | None:
        from ..shards import mock_enabled
        path = self.resolve_material(project, "teacher") / "config.json"
        if not path.is_file() and mock_enabled(project):
            return None
        path = self.require_material(project, "teacher") / "config.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelFileError(f"The teacher config {path} cannot be read ({e}); download the teacher again.") from None

    def teacher_dims(self, project: "Project") -> dict[str, int]:
        """text_config.hidden_size and vision_config.out_hidden_size of the teacher's config.json (the
        reference shapes when the teacher is mocked and not downloaded)."""
        config = self._teacher_config(project)
        if config is None:
            return {"out_dim": OUT_DIM, "vis_dim": VIS_DIM}
        try:
            return {"out_dim": int(config["text_config"]["hidden_size"]),
                    "vis_dim": int(config["vision_config"]["out_hidden_size"])}
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"The teacher config in {self.resolve_material(project, 'teacher')} is not a "
                                 "Qwen3-VL config (text_config.hidden_size, vision_config.out_hidden_size); "
                                 "download Qwen/Qwen3-VL-4B-Instruct again.") from None

    def build_teacher(self, project: "Project", device: Any) -> Any:
        from .qwen3vl_teacher import Qwen3VLTeacher
        p = project.settings.precompute
        return Qwen3VLTeacher(self.require_material(project, "teacher"), device=device, mode=p.teacher_mode,
                              gpu_mem_gib=p.gpu_mem_gib)

    def build_mock_teacher(self, project: "Project") -> Any:
        from .qwen3vl_teacher import MockVisionTeacher
        dims = self.teacher_dims(project)
        return MockVisionTeacher(dims["out_dim"], dims["vis_dim"])

    def budgets(self, project: "Project", device: Any) -> Budgets:
        from .qwen3vl_teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device, BUDGET_SCALE)
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       p.student_batch or auto["student_batch"], p.student_tok_budget or auto["student_tok_budget"],
                       p.vis_tok_budget or auto["vis_tok_budget"])

    def read_samples(self, project: "Project", path: Path) -> list[dict[str, Any]]:
        """{"text", "images": [paths], "rel": [as written]} per line of a corpus .jsonl (image paths are
        relative to data/)."""
        samples = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
                text, rel = record["text"], list(record.get("images") or [])
                if not isinstance(text, str) or not all(isinstance(r, str) for r in rel):
                    raise ValueError("text must be a string and images a list of paths")
            except (ValueError, KeyError, TypeError) as e:
                raise TrainerError(f"{path} line {number} is not an image-corpus record ({e}); "
                                   "reset the corpus and run it again.") from None
            samples.append({"text": text, "images": [project.data_dir / r for r in rel], "rel": rel})
        return samples

    def prepare(self, project: "Project", student: Any, teacher: Any, report: Any) -> Any:
        """Check both tokenizers against the engine's templates and each other, then fit (or reuse) vision_proj;
        returns its weight [in_dim, vis_dim]."""
        from ..vision_data import build_sample, check_templates
        check_templates(student.tokenizer, "student")
        teacher_tok = getattr(teacher, "tokenizer", None)
        if teacher_tok is not None:
            check_templates(teacher_tok, "teacher")
            for text in PROBES:
                for counts in ((), (144,), (144, 144)):
                    a = build_sample(student.tokenizer, text, counts)
                    b = build_sample(teacher_tok, text, counts, what="teacher")
                    if a.ids != b.ids:
                        raise ModelFileError(f"The student and teacher tokenizers disagree on {text!r} with "
                                             f"{len(counts)} image(s) ({len(a.ids)} vs {len(b.ids)} tokens); the "
                                             "adapter needs one token sequence for both: use matching snapshots.")
        return self._vision_proj(project, student, teacher, report)

    def _vision_proj(self, project: "Project", student: Any, teacher: Any, report: Any) -> Any:
        import time

        import torch

        from ..vision_proj import (fit_vision_proj, load_vision_proj, safetensors_rows, save_vision_proj,
                                   tensor_rows)
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
            root = self.resolve_material(project, "teacher")
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
               message=f"vision_proj fitted in {time.monotonic() - started:.1f} s: row cos mean {fit.fit_cos_mean:.4f}, "
                       f"5th percentile {fit.fit_cos_p5:.4f}, rel_mse {fit.rel_mse:.4g}; saved to {path.name}")
        return fit.weight

    def make_shard(self, prompts: list[Any], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Token-aligned layout (packs-contract §B.2.5), samples sorted by length."""
        import torch

        from ..batching import greedy_batches
        from ..vision_data import build_sample, preprocess
        weight = session                                                    # vision_proj [in, vis]
        images, counts = [], []
        for sample in prompts:
            pre = []
            for path in sample["images"]:
                try:
                    pre.append(preprocess(path))
                except (OSError, ValueError) as e:
                    raise TrainerError(f"The reference image {path} cannot be read ({e}); reset the corpus "
                                       "so it is built again without it.") from None
            images.append(pre)
            counts.append([(im.shape[0] // 32) * (im.shape[1] // 32) for im in pre])
        built = [build_sample(student.tokenizer, s["text"], n) for s, n in zip(prompts, counts)]
        truncated = sum(len(b.ids) > self.max_len_student for b in built)
        order = sorted(range(len(prompts)), key=lambda i: len(built[i].ids))
        prompts, images, built = [prompts[i] for i in order], [images[i] for i in order], [built[i] for i in order]
        tokens = [b.ids[:self.max_len_student] for b in built]
        flat = [im for pre in images for im in pre]
        vis_rows = teacher.encode_images(flat, budgets.vis_tok_budget) if flat else []
        vision, k = [], 0                                                   # per sample: (slot, raw rows)
        for b, pre in zip(built, images):
            vision.append([(start, vis_rows[k + j]) for j, (start, n) in enumerate(b.slots)
                           if start + n <= self.max_len_student])
            k += len(pre)
        t_rows: list[torch.Tensor] = [None] * len(tokens)                   # type: ignore[list-item]
        for batch in greedy_batches([len(t) for t in tokens], budgets.teacher_batch, budgets.tok_budget):
            for i, rows in zip(batch, teacher.hidden([tokens[i] for i in batch], [vision[i] for i in batch])):
                t_rows[i] = rows.to(torch.bfloat16)
        mapped = [[(start, (v.float() @ weight.T)) for start, v in sample] for sample in vision]
        q_rows = student.vision_rows(tokens, mapped, budgets.student_batch, budgets.student_tok_budget)
        t_pack = torch.cat(t_rows)
        t64 = t_pack.double()
        blocks = [(i, start, v) for i, sample in enumerate(vision) for start, v in sample]
        vis_dim = vis_rows[0].shape[1] if vis_rows else int(weight.shape[1])
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.tensor([len(t) for t in tokens], dtype=torch.int32),
            "v_pack": (torch.cat([v for _, _, v in blocks]) if blocks
                       else torch.zeros(0, vis_dim, dtype=torch.bfloat16)).to(torch.bfloat16),
            "vis_sample": torch.tensor([i for i, _, _ in blocks], dtype=torch.int32),
            "vis_start": torch.tensor([s for _, s, _ in blocks], dtype=torch.int32),
            "vis_len": torch.tensor([v.shape[0] for _, _, v in blocks], dtype=torch.int32),
            "sup_start": torch.tensor([b.sup_start for b in built], dtype=torch.int32),
            "n_images": torch.tensor([len(pre) for pre in images], dtype=torch.int32),
            "t_sparse": torch.zeros(1, dtype=torch.int64),
            "stat_s": t64.sum(0), "stat_s2": (t64 * t64).sum(0),
            "stat_n": torch.tensor([t_pack.shape[0]], dtype=torch.int64),
        }
        return tensors, {"prompts": [s["text"] for s in prompts], "num_queries": 0, "truncated_student": truncated,
                         "meta": {"images": [s["rel"] for s in prompts], "tap": "final_norm", "supervise": "all",
                                  "vision_contract": "mageflow_edit"}}

    def adapter_config(self, project: "Project", in_dim: int) -> "AdapterConfig":
        from ..adapter import AdapterConfig
        dims, t = self.teacher_dims(project), project.settings.train
        return AdapterConfig("token_aligned_vision", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, vis_dim=dims["vis_dim"])


PACK = MageFlowPack(
    id="qwen3vl_mageflow",
    title="MageFlow-Edit (Qwen3-VL-4B-Instruct → token-aligned + vision)",
    description=(
        "Replaces the Qwen3-VL-4B-Instruct text stack of MageFlow-Edit with pig_clip and a "
        "token-aligned adapter with a vision extension (the trainer5 recipe): a frozen "
        "vision_proj (2560 → 1024) and a trained vis_in let the unchanged "
        "mmproj-qwen3vl-4b-it-f16.gguf vision encoder drive editing as well as text-to-image. "
        "Trains on an image corpus (Flickr30k by default) with synthesized edit instructions."
    ),
    adapter_kind="token_aligned_vision",
    corpus_kind="image",
    default_folder="qwen3vl_4b_adapter",
    shard_contract="qwen3vl_mageflow/1",
    teacher_repo="Qwen/Qwen3-VL-4B-Instruct",
    defaults={
        "corpus": {
            "image_presets": ["flickr30k"],
            "n_image": 56000, "n_two": 3000, "n_text": 27000,
            "n_val_image": 1024, "n_val_text": 512,
            "empty_frac": 0.015,
        },
        "precompute": {
            "shard_size": 512, "val_shard_size": 256,
            "teacher_batch": 0, "tok_budget": 0, "student_batch": 0,
            "student_tok_budget": 0, "vis_tok_budget": 0, "teacher_mode": "auto",
        },
        "train": {"depth": 4},
        "export": {"export_sigvq": False},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3-VL-4B-Instruct",
        "adapter.teacher_tap": "final_norm",
    },
    reference_dims={"out_dim": OUT_DIM, "vis_dim": VIS_DIM},
    t2i_template=T2I_PREFIX + "{text}" + SUFFIX,
    t2i_start=34,
    max_len_student=1024,
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos_slice", "cos_vis", "cos_txt", "cos", "rel_mse", "worst_sample_cos_slice", "roundtrip_cos", "trained_steps", "val_samples"),
    ggk_args="--llm pig_clip-q8_0.gguf --llm-adapter {gguf} --llm_vision mmproj-qwen3vl-4b-it-f16.gguf",
)
