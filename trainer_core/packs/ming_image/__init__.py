"""Ming-Image 0.1 (Design and Design-Layer): caption bank + Ling-token-seeded slots, with its vision export.

Ming-Image conditions its DiT on two things its 16B Ling-mini-2.0 MLLM produces: 256 caption rows
(learned queries read back after the thinker, refined by a 28-layer Qwen2 connector, cap_dim wide)
and one "direct" row per Ling prompt token (hidden states 5/12/20 concatenated, RMSNorm + Linear to
the DiT width). The `ming_image` adapter reads pig_clip's rows of the raw prompt with a caption query
bank and one seeded slot per Ling prompt token (slot query + PCA seed of the Ling id + the input
image's Ling vision row under its `<imagePatch>` slots); the Ling tokenizer rides in the GGUF as the
`tokenizer_json` byte tensor, since the engine tokenizes the Ling template itself. Input images go
through the Qwen2.5-VL tower + linear_proj, exported from the same snapshot to
`<name>_vision-<quant>.gguf` (`--llm_vision`). packs-contract-more §D.1, Parts E–F.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.base.config import pack_setting
from trainer_core.base.errors import ModelFileError
from trainer_core.base.parsers import boolean, choice, count
from trainer_core.packs.common.slot_settings import SLOT_SETTINGS
from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, EngineFacts, ExportContents, Material
from trainer_core.packs.common.qwen3vl.vision_pack import DEMO_IMAGES, IMAGE_DEMO_SETTINGS, VisionPack
from trainer_core.packs.lookup import material_json, read_config_json, require_material, resolve_material
from trainer_core.packs.ming_image.extras import MingExtras, vision_path
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "MingPack", "TEACHER"]

OUT_DIM, CAP_DIM, VIS_DIM, SEED_VOCAB, N_CAP = 3840, 2560, 2048, 157184, 256
# the disk estimate: ~35 Ling slots and ~20 student rows a text sample; an input image adds ~600
# vision rows and as many slots (558–612 for common photos)
_TEXT_SLOTS, _STUDENT_ROWS, _IMAGE_TOKENS = 35, 20, 600
_LAYERS = (2, 3, 4, 5, 6, 7, 8)             # layer counts the corpus asks for (the engine's default is 5)

TEACHER = Material(
    "teacher", "Ming-Image-0.1-Design (teacher: thinker, connector, projections)", "hf_snapshot",
    repo="inclusionAI/Ming-Image-0.1-Design",
    patterns=("mllm/config.json", "mllm/model-*.safetensors", "mllm/model.safetensors.index.json",
              "mllm/preprocessor_config.json", "mllm/tokenizer.json", "mllm/tokenizer_config.json",
              "mllm/special_tokens_map.json", "connector/config.json", "connector/model-*.safetensors",
              "connector/model.safetensors.index.json", "mlp/config.json", "mlp/model.safetensors"),
    subdir="Ming-Image-0.1-Design", size_hint="~38 GB", model=True,
    hint="the 16B Ling thinker with its vision tower (~32 GB bf16), the connector (~5.8 GB) and the "
         "projections; resident it needs ~36 GB of GPU memory, smaller cards stream the thinker from RAM; "
         "its tokenizer goes into the adapter and its vision tower is exported for editing")

STOCK_MMPROJ = Material(
    "stock_mmproj", "Stock Qwen2.5-VL mmproj (optional: fits the adapter's vis_bridge)", "local_file",
    suffixes=(".gguf",), required=False, size_hint="~1.3 GB",
    hint="a llama.cpp Qwen2.5-VL mmproj, e.g. mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf; the export then fits the "
         "adapter's vis_bridge so that file can replace pig_ming_vision for editing")


@dataclass(frozen=True)
class MingPack(VisionPack):
    teacher_class: str = "trainer_core.packs.ming_image.teacher:MingTeacher"
    """A VisionPack for its image corpus and reading of samples; the seeded-slot trunk of the Qwen3.5
    bridge (its seed table) with Ming's caption bank."""

    invalidating: tuple[str, ...] = ("train.max_slots",)

    def student_chunks(self, text: str) -> list[str]:
        """The raw prompt, one chunk, no attention parse (the engine's Ming adapter path)."""
        return [text]

    def shard_contract_of(self, project: "ProjectFolder") -> str:
        return f"{self.shard_contract}+slots{project.settings.train.max_slots}"

    def _layer_prompt(self, rng: Any, caption: str) -> str:
        """"Decompose this image into N layers.\\n<caption>" or "<caption>\\nNumber of layers: N" (the two
        forms the engine reads), N from 2 … 8; the bare instruction when the caption names a count itself."""
        from trainer_core.packs.ming_image.template import layer_prompt
        n, style = rng.choice(_LAYERS), rng.choice(("decompose", "number"))
        try:
            return layer_prompt(caption, n, style)
        except ValueError:
            return layer_prompt("", n, style)

    def corpus_draws(self, c: Any, rng: Any, val: list[Any], train: list[Any], entries: Any
                     ) -> tuple[dict[str, int], list[str]]:
        """corpus.n_val_layer / n_layer single-image samples of each split take a layer-decomposition
        instruction over one of their image's captions (Ming-Image-Layer reads the layer count from the
        prompt); at 0 nothing is drawn."""
        from trainer_core.contract.image_corpus import Sample, clean
        layered = {"val": 0, "train": 0}
        for name, split, n in (("val", val, c.n_val_layer), ("train", train, c.n_layer)):
            if not n:
                continue
            singles = [row for row, sample in enumerate(split) if len(sample.images) == 1]
            for row in rng.sample(singles, min(n, len(singles))):
                caps = entries[split[row].images[0]].captions
                split[row] = Sample(self._layer_prompt(rng, clean(rng.choice(caps)) if caps else ""),
                                    split[row].images, split[row].has_bank_target)
                layered[name] += 1
        notes = ([f"{layered['train']} train and {layered['val']} val samples ask for a layer decomposition"]
                 if layered["train"] or layered["val"] else [])
        return {"layer": layered["train"], "val_layer": layered["val"]}, notes

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """Direct rows (out_dim) and caption rows (cap_dim) from mlp/config.json, the vision rows (vis_dim,
        the thinker's width) and the Ling vocabulary (seed_vocab) from mllm/config.json; the reference
        shapes when the teacher is mocked and not downloaded."""
        mlp = material_json(project, "teacher", "mlp/config.json")
        if mlp is None:
            return dict(self.reference_dims)
        root = require_material(project, "teacher")
        mllm = read_config_json(root / "mllm" / "config.json", self.teacher_repo)
        try:
            llm = mllm["llm_config"]
            return {"out_dim": int(mlp.get("diffusion_inner_dim", OUT_DIM)),
                    "cap_dim": int(mlp.get("diffusion_c_input_dim", CAP_DIM)), "vis_dim": int(llm["hidden_size"]),
                    "seed_vocab": int(llm["vocab_size"]), "num_queries": N_CAP}
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{root / 'mllm' / 'config.json'} lacks llm_config.hidden_size / vocab_size; "
                                 f"download {self.teacher_repo} again.") from None

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.ming_image.teacher import MockMingTeacher
        dims = self.teacher_dims(project)
        tokenizer = resolve_material(project, "teacher") / "mllm" / "tokenizer.json"
        return MockMingTeacher(dims["out_dim"], dims["cap_dim"], dims["vis_dim"],
                               tokenizer if tokenizer.is_file() else None)

    # ------------------------------------------------------------ precompute
    def prepare(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> Any:
        """Check the Ling tokenizer against the engine's template, fit or reuse the seed table."""
        from trainer_core.packs.ming_image.shards import MingSession
        from trainer_core.packs.ming_image.template import check_template
        from trainer_core.packs.common.seed_table import ensure_seed_table
        check_template(teacher.encode)
        ensure_seed_table(project.root / "seed_table.pt", self.teacher_dims(project)["seed_vocab"],
                          project.settings.train.seed_rank, self.id, teacher, report, self.teacher_repo)
        log = lambda m: report("log", level="warning", message=m)  # noqa: E731
        return MingSession(teacher.encode, project.settings.train.max_slots, log)

    def make_shard(self, prompts: list[Any], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        from trainer_core.packs.ming_image.shards import build_shard
        out = build_shard(prompts, student, teacher, budgets, session, self.max_len_student)
        if session.extra_images:
            session.log(f"{session.extra_images} sample(s) carry more than one image; Ming reads the first only "
                        "(as the engine does)")
            session.extra_images = 0
        return out

    # ------------------------------------------------------------ train / export
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("ming_image", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width, depth=t.depth,
                             seed_vocab=dims["seed_vocab"], seed_rank=t.seed_rank, vis_dim=dims["vis_dim"],
                             max_slots=t.max_slots, n_bank=dims["num_queries"], bank_dim=dims["cap_dim"])

    def load_frozen(self, project: "ProjectFolder", model: Any) -> None:
        """The seed table precompute fitted, into the frozen seed_embed."""
        from trainer_core.packs.common.seed_table import load_seed_into
        load_seed_into(project.root / "seed_table.pt", model, self.id)

    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        """The target's description, and the tensors the engine reads beside adapter.*: `tokenizer_json`, the
        Ling tokenizer.json, one F16 element per byte (0 … 255, exact), which the engine reads to tokenize the
        Ming template (an export without it is refused); and the fitted `vis_bridge.*` when there is one for
        these inputs (bridge_fit.py)."""
        kvs = {**self.export_kvs,
               "adapter.target": f"ming_image caption tokens (connector proj_out, {config.n_bank} x "
                                 f"{config.bank_dim}) + directvlm rows ({config.out_dim} per Ling token)"}
        return ExportContents(kvs=kvs, tensors=self._tensors(project))

    def _tensors(self, project: "ProjectFolder") -> dict[str, Any]:
        import numpy as np

        from trainer_core.contract.adapter_layout import TOKENIZER_JSON
        path = resolve_material(project, "teacher") / "mllm" / "tokenizer.json"
        try:
            data = path.read_bytes()
        except OSError:
            raise ModelFileError(f"The adapter must carry the Ling tokenizer but {path} is missing; download the "
                                 f"teacher ({self.teacher_repo}) — its mllm/tokenizer.json is enough — then export "
                                 "again.") from None
        out = {TOKENIZER_JSON: np.frombuffer(data, dtype=np.uint8).astype(np.float16)}
        from trainer_core.packs.ming_image.bridge_fit import fitted_bridge
        from trainer_core.contract.vis_bridge import bridge_tensors
        fitted = fitted_bridge(project)                       # the engine reads it beside adapter.*
        if fitted is not None:
            for name, t in bridge_tensors(fitted[0]).items():
                out[name] = t.numpy().astype(np.float16 if t.ndim == 2 else np.float32)
        return out

    def student_states(self, student: Any, text: str) -> Any:
        ids, mask = student.batch([student.tokenize(text)])
        return student.hidden(ids, mask)[0].cpu().numpy()

    def prompt_inputs(self, project: "ProjectFolder | None", adapter: Path, text: str, vis: Any) -> dict[str, Any]:
        """The Ling ids of the Ming template around the prompt, tokenized with the tokenizer the adapter
        file carries (as the engine does), and the input image's run from its first <imagePatch> slot."""
        from trainer_core.packs.ming_image.template import seed_ids_from_file
        ids, start = seed_ids_from_file(adapter, text, 0 if vis is None else vis.shape[0])
        return {"--seed-ids": ids, **({"--vis-pos": [(start, vis.shape[0])]} if vis is not None else {})}

    def ggk_command(self, project: "ProjectFolder") -> str:
        """Text-to-image on Ming-Image-0.1-Design; editing adds the vision GGUF and a reference; layers run
        the -Layer DiT with a prompt file that names the layer count."""
        t2i = super().ggk_command(project)
        vision = vision_path(project)
        edit = t2i.replace(' -p "a prompt"', f' --llm_vision {vision} --ref-image ref.png -p "make it night"')
        layers = (t2i.replace("ming-image-0.1-design-nvfp4.gguf", "ming-image-0.1-design-layer-nvfp4.gguf")
                  .replace(' -p "a prompt"', f" --llm_vision {vision} --ref-image ref.png --prompt-file spec.txt "
                                             "-W 512 -H 512"))
        return "\n".join((t2i, edit, layers))

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """Per sample: the student's rows, the 256 caption rows, a direct row per Ling slot; an input image
        adds ~600 slots and as many vision rows; averaged over the corpus mix."""
        c = project.settings.corpus
        samples = c.n_image + c.n_two + c.n_text + c.n_val_image + c.n_val_text
        images = c.n_image + c.n_two + c.n_val_image
        per = (_STUDENT_ROWS * student_dim + N_CAP * dims.get("cap_dim", CAP_DIM)
               + _TEXT_SLOTS * dims["out_dim"]) * 2
        vis = images * _IMAGE_TOKENS * (dims["out_dim"] + dims.get("vis_dim", VIS_DIM)) * 2
        return per + vis / max(samples, 1)

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Ming snapshot (thinker, tower, connector, projections, a small Ling-format
        tokenizer) and generated captioned scenes."""
        from trainer_core.packs.common.tiny_models import write_demo_images
        from trainer_core.packs.ming_image.tiny import write_tiny_ming, write_tiny_stock_mmproj
        write_tiny_ming(resolve_material(project, "teacher"), cap_dim=96, direct_dim=128)
        write_tiny_stock_mmproj(project.materials_dir / "mmproj-tiny-qwen2.5vl-f16.gguf",
                                resolve_material(project, "teacher"))
        write_demo_images(project.materials_dir / "demo_images", DEMO_IMAGES)


PACK = MingPack(
    id="ming_image",
    order=60,
    demo_order=7,
    title="Ming-Image 0.1 (Ling-mini-2.0 MLLM → caption bank + Ling-seeded slots)",
    description=(
        "Replaces the 16B Ling-mini-2.0 MLLM of Ming-Image 0.1 Design and Design-Layer with pig_clip and a "
        "resampler that emits the DiT's 256 caption rows and one direct row per Ling prompt token (each slot "
        "seeded with the Ling token id and, for an input image, its Ling vision row). The Ling tokenizer rides "
        "in the adapter; the input-image encoder (Qwen2.5-VL tower + linear_proj) is exported beside it as "
        "pig_ming_vision. Needs ggk 0.7.7 or later."
    ),
    adapter_kind="ming_image",
    default_folder="ming_adapter",
    shard_contract="ming_image/1",
    teacher_repo="inclusionAI/Ming-Image-0.1-Design",
    defaults={
        "corpus": {"image_presets": ["flickr30k"], "n_image": 8000, "n_two": 0, "n_text": 16000,
                   "n_val_image": 256, "n_val_text": 384, "empty_frac": 0.015, "n_layer": 1200, "n_val_layer": 32},
        "precompute": {"shard_size": 256, "val_shard_size": 128, "teacher_batch": 0, "tok_budget": 0,
                       "student_batch": 0, "student_tok_budget": 0, "vis_tok_budget": 0, "teacher_mode": "auto"},
        "train": {"width": 1024, "depth": 6, "steps": 20000, "batch_size": 32, "seed_rank": 512, "max_slots": 1280,
                  "batch_tokens": 20480, "sigma_floor": 0.03},
        "export": {"export_vision": True, "vision_quant": "f16"},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "inclusionAI/Ming-Image-0.1-Design",
        "adapter.student_prompt": "raw_text",
        "adapter.vision": "ling qwen2.5-vl tower + linear_proj, L2-normalised (pig_ming_vision)",
    },
    ggk_min_version="0.7.7",
    budget_scale=0.5,
    max_len_student=4096,          # the engine does not truncate the raw prompt (Part E 1)
    materials=STUDENT_MATERIALS + (TEACHER, STOCK_MMPROJ),
    metric_names=("cos_centered", "cos_centered_cap", "cos_centered_dir", "cos_rms", "cos_rms_cap", "cos_rms_dir",
                  "cos_raw_cap", "cos_raw_dir", "rel_mse", "rel_mse_cap", "rel_mse_dir", "roundtrip_cos",
                  "worst_row_cos_rms", "val_batches", "val_samples"),
    judge=EvalGuide(
        headline="cos_centered", also=("cos_centered_cap", "cos_centered_dir", "rel_mse"),
        good="cos_centered is the mean of the caption bank's (cos_centered_cap) and the direct slots' "
             "(cos_centered_dir) centred cosines; compare runs by it and by rel_mse",
        source="none: no reference run of Ming-Image with an adapter is published"),
    engine=EngineFacts(versions=("ming_image",), raw_prompt=True, references="vision_gguf",
                       vision_tower="trainer_core.packs.ming_image.tower"),
    extras=MingExtras(),
    ggk_model_args="--diffusion-model ming-image-0.1-design-nvfp4.gguf --vae pig_ming_image_vae_bf16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --steps 12 --diffusion-fa --offload-to-cpu",
    ggk_edit_args="",             # ggk_command already names the edit and layers lines
    reference_dims={"out_dim": OUT_DIM, "cap_dim": CAP_DIM, "vis_dim": VIS_DIM, "seed_vocab": SEED_VOCAB,
                    "num_queries": N_CAP},
    settings=(*SLOT_SETTINGS,
              pack_setting("corpus.n_layer", 0, count(0), "training image samples whose instruction asks for a layer "
                           "decomposition (Ming-Image-Layer: \"Decompose this image into N layers\")"),
              pack_setting("corpus.n_val_layer", 0, count(0),
                           "validation image samples with a layer-decomposition instruction"),
              pack_setting("export.export_vision", True, boolean,
                           "also write the teacher's vision tower as a GGUF for editing (pig_ming_vision)"),
              pack_setting("export.vision_quant", "f16", choice("f16", "q8_0"), "the vision GGUF's weights"),
              pack_setting("export.vis_bridge", True, boolean, "fit the adapter's vis_bridge when a stock Qwen2.5-VL "
                           "mmproj is picked, so that file can stand in for pig_ming_vision"),
              pack_setting("export.vis_bridge_steps", 2000, count(maximum=1_000_000),
                           "vis_bridge fitting steps (one image each)"),
              pack_setting("export.vis_bridge_width", 1024, count(64, multiple_of=64),
                           "vis_bridge width, a multiple of 64"),
              pack_setting("export.vis_bridge_depth", 2, count(0), "vis_bridge blocks (0 = a linear map)"),
              pack_setting("export.vis_bridge_images", 256, count(),
                           "input images of the train shards the vis_bridge fits on")),
    # the demo: every image comes out at the engine's 672² area (576 slots), so the demo keeps images
    # few and its run under a minute on 2 cores; 768 slots hold an image and its prompt
    demo_settings=(*IMAGE_DEMO_SETTINGS, "corpus.n_two=0", "corpus.n_image=16", "corpus.n_text=32",
                   "corpus.n_val_image=4", "corpus.n_val_text=6", "corpus.n_layer=4", "corpus.n_val_layer=1",
                   "precompute.shard_size=24", "precompute.val_shard_size=10", "train.seed_rank=16",
                   "train.max_slots=768", "train.batch_tokens=0", "train.batch_size=6", "train.steps=100",
                   "train.val_every=50", "train.save_every=50", "materials.stock_mmproj.path=materials/"
                   "mmproj-tiny-qwen2.5vl-f16.gguf", "export.vis_bridge_steps=80", "export.vis_bridge_width=64",
                   "export.vis_bridge_depth=1", "export.vis_bridge_images=12"),
)
