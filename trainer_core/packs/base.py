"""The pack interface: what a trainer pack declares and the hooks the stages call.

A pack is declarative data (identity, adapter kind, corpus kind, materials, defaults,
templates, export KVs, metric names and how to judge them, the ggk command line) plus a few hooks:

    student_chunks(text)                   the engine's chunks of a prompt, each tokenized on its own
    teacher_dims(project)                  dimensions read from the teacher's config
    build_teacher(project, device)         the real teacher, loaded once per stage process (by default
                                           `teacher_class`, placed by contract/placement.py's rule)
    teacher_need_gib(project)              what that teacher needs on a card to stay resident (the plan's
                                           figure; the teacher module's resident_need_gib)
    build_mock_teacher(project)            synthetic targets of the right shapes
    prepare(project, student, teacher, report)  once per precompute stage: the session make_shard gets
    make_shard(prompts, student, teacher, budgets, session) -> (tensors, meta)   one shard's content
                                           (student, teacher: contract/roles.py's protocols)
    adapter_config(project, in_dim, dims)  the adapter the train stage builds (dims: the teacher's, read
                                           from its config unless given; the plan gives reference_dims)
    ggk_command(project)                   the engine command line that uses the export
    adapter_kvs(config)                    the pack's KVs of an export (export_kvs + shape-dependent ones)
    export_arrays(project)                 string-array KVs an export writes after those (a vocabulary)
    export_tensors(project)                top-level tensors an export writes after the adapter's (Ming's
                                           tokenizer_json)
    corpus_draws(c, rng, val, train, entries)  the pack's own draws over an image corpus's samples (the
                                           Klein targets, Ming's layer prompts); corpus_notes(counts)
                                           what the corpus summary says of them
    student_states(student, text)          the student's rows for a prompt, as the engine feeds the adapter
    prompt_inputs(adapter, text, vis)      the adapter's other infer inputs the engine derives from a prompt
                                           (Ming's template ids, from the tokenizer the file carries)
    export_extras(project, report)         what the export stage writes beside the adapter (SigVQ)
    extra_outputs(project)                 those files, for the Output tab and `status`
    shard_bytes(project, dims, student_dim)  disk a sample's shard rows take, from the pack's shapes
    build_demo_materials(project, prompts) the demo's tiny teacher (and images) under materials/

Dimensions that come from a model (student hidden size, teacher width, vocab sizes) are read
from the materials' configs when the stages run, never hard-coded, so the same code runs
the real shapes and the tiny ones of the tests and the demo. See docs/PACKS.md.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from trainer_core.base.config import PackSetting
from trainer_core.base.errors import StageNotAvailableError, UsageError
from trainer_core.contract.prompt_attention import parse_prompt_attention, plain_text
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:  # the stages import torch; the registry stays light
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.contract.roles import Student, Teacher
    from trainer_core.base.folder import ProjectFolder

__all__ = ["TrainerPack", "Material", "Budgets", "CORPUS_KINDS", "STUDENT_MATERIALS", "read_config_json",
           "IMAGE_PRESET_MATERIALS", "STUDENT_FILE", "PIG_CLIP_WIDTH", "CHARS_PER_TOKEN", "DEMO_SETTINGS"]

CORPUS_KINDS = ("text", "image")


def read_config_json(path: Path, repo: str, what: str = "config") -> dict[str, Any]:
    """The JSON object in a snapshot's file, or ModelFileError naming the file and the repo to download again."""
    from trainer_core.base.errors import ModelFileError
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"The {what} {path} is missing; download {repo} again.") from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"The {what} {path} cannot be read ({e}); download {repo} again.") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"The {what} {path} is not a JSON object; download {repo} again.")
    return data


@dataclass(frozen=True)
class Material:
    """Something a pack needs on disk: a Hub snapshot or a local file the user picks."""

    id: str
    title: str
    kind: str                          # "hf_snapshot" | "local_file"
    repo: str = ""
    repo_type: str = "model"
    patterns: tuple[str, ...] = ()     # allow-patterns of the snapshot
    subdir: str = ""                   # under <project>/materials/
    required: bool = True
    wanted_if: str = ""                # optional: the boolean setting ("export.export_sigvq") that asks for it
    size_hint: str = ""
    suffixes: tuple[str, ...] = ()     # local files
    hint: str = ""


# the student file a ggk command line names when the project has none picked
STUDENT_FILE = "pig_clip-q8_0.gguf"
PIG_CLIP_WIDTH = 1024     # pig_clip's hidden size (Qwen3 0.6B), for estimates before the student is on disk
CHARS_PER_TOKEN = 4.0     # English prompts in the Qwen BPE or T5's sentencepiece, on average (the estimates')
_SAMPLE_BYTES = 1 << 16   # prompt_tokens reads this much of each prompt file

# the demo project's settings of every pack (a pack's `demo_settings` go over them); sized so
# `gguf-trainer run` finishes every stage quickly on 2 CPU cores
DEMO_SETTINGS = (
    "corpus.presets=[]", "corpus.n_train=360", "corpus.n_val=40", "corpus.seed=8",
    "precompute.shard_size=120", "precompute.val_shard_size=40", "precompute.device=cpu",
    "train.device=cpu", "train.width=64", "train.depth=2", "train.steps=200", "train.batch_size=16",
    "train.warmup=20", "train.log_every=10", "train.val_every=50", "train.save_every=50",
)

STUDENT_MATERIALS = (
    Material("student", "pig_clip student GGUF", "local_file", suffixes=(".gguf",),
             hint="your pig_clip-f16.gguf (quantized files are dequantized on load; train against f16)"),
    Material("student_tokenizer", "pig_clip tokenizer and config", "hf_snapshot",
             repo="callgg/pig-clip-tokenizer",
             patterns=("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                       "vocab.json", "merges.txt"),
             subdir="pig-clip-tokenizer", size_hint="~11 MB"),
)


# The image datasets of the image packs' corpus, one material per entry of corpus.image_presets.
IMAGE_PRESET_MATERIALS = {
    "flickr30k": Material("images_flickr30k", "Flickr30k photos and captions (image corpus)", "hf_snapshot",
                          repo="nlphuji/flickr30k", repo_type="dataset",
                          patterns=("flickr30k-images.zip", "flickr_annotations_30k.csv"), subdir="flickr30k",
                          size_hint="~4.4 GB", hint="31k photos with 5 captions each"),
    "coco_captions": Material("images_coco_captions", "COCO captions, Karpathy train split (image corpus)",
                              "hf_snapshot", repo="Multimodal-Fatima/COCO_captions_train", repo_type="dataset",
                              patterns=("data/*.parquet",), subdir="coco_captions", size_hint="~17 GB",
                              hint="113k photos with 5 captions each, in 38 parquet shards"),
}


@dataclass(frozen=True)
class Budgets:
    """Batch sizes and token budgets of one precompute run (settings of 0 already resolved)."""

    teacher_batch: int
    tok_budget: int
    student_batch: int
    student_tok_budget: int
    vis_tok_budget: int = 0      # image packs: merged vision tokens per vision-tower batch


@dataclass(frozen=True)
class TrainerPack:
    id: str                       # "llada_image"
    title: str                    # shown in the New project form
    description: str              # one paragraph for the GUI and `gguf-trainer packs`
    adapter_kind: str             # a registered adapter kind (contract/kinds/)
    corpus_kind: str              # "text": data/{train,val}.txt; "image": data/{train,val}.jsonl
    default_folder: str           # project folder (and adapter name without "pig_")
    shard_contract: str           # the CONTRACT string precomputed shards are written under
    teacher_repo: str             # Hugging Face repo of the teacher
    defaults: Mapping[str, Any] = field(default_factory=dict)   # overlay over built-in settings
    export_kvs: Mapping[str, Any] = field(default_factory=dict)  # pack KVs every export writes
    ggk_min_version: str = ""     # the first ggk release that loads this pack's adapter
    # The text-to-image prompt as the engine builds it for the student ("{text}" is replaced);
    # `t2i_empty` is the whole string for an empty prompt when the engine has a special form;
    # `t2i_start` is the number of leading output rows the engine drops before the DiT.
    t2i_template: str = "{text}"
    t2i_empty: str | None = None
    t2i_start: int = 0
    max_len_student: int = 512    # student tokens kept per prompt (resampler kinds truncate)
    materials: tuple[Material, ...] = STUDENT_MATERIALS
    metric_names: tuple[str, ...] = ()     # eval.json keys, in the order the GUI shows them
    ggk_args: str = ""            # the engine flags that use the adapter ({student}, {gguf} are replaced)
    ggk_edit_args: str = ""       # what editing adds to that command line (Qwen-Image 2.1: the mmproj)
    ggk_model_args: str = "--diffusion-model MODEL.gguf --vae VAE.gguf"   # the DiT and VAE files it names
    engine_versions: tuple[str, ...] = ()  # the ggk model versions whose conditioner runs the adapter (the names
                                           # bench/engine_check.py's driver takes; the first is the main one)
    teacher_control: str = "teacher_mode"   # the precompute setting that places the teacher ("placement")
    reference_dims: Mapping[str, int] = field(default_factory=dict)  # the real teacher's shapes, for estimates
    settings: tuple[PackSetting, ...] = ()  # settings only this pack has (config.pack_setting): their parser,
                                           # default and help; the GUI shows them for it alone
    demo_settings: tuple[str, ...] = ()    # the demo project's settings over DEMO_SETTINGS
    invalidating: tuple[str, ...] = ()     # settings of this pack whose change makes the shards stale
    order: int = 100                       # where the GUI lists it (ascending; then by id)
    demo_order: int = 0                    # where it is among the demos (ascending); 0 = it has no demo
    judge: EvalGuide | None = None         # how to read its eval.json: the metric to judge by, the published
                                           # figures and their source (packs/eval_guide.py)

    def __post_init__(self) -> None:
        from trainer_core.contract.kinds import kind_names
        if self.adapter_kind not in kind_names():
            raise ValueError(f"pack {self.id}: unknown adapter kind {self.adapter_kind!r}; the registered kinds "
                             f"are {', '.join(kind_names())}")
        if self.corpus_kind not in CORPUS_KINDS:
            raise ValueError(f"pack {self.id}: unknown corpus kind {self.corpus_kind!r}")
        unknown = [k for k in (self.judge.keys() if self.judge else ()) if k not in self.metric_names]
        if unknown:
            raise ValueError(f"pack {self.id}: its judge names {unknown}, which are not among its metric_names")

    @property
    def extra_settings(self) -> tuple[str, ...]:
        """The keys of the pack's own settings ("train.max_slots", …)."""
        return tuple(s.key for s in self.settings)

    @property
    def default_name(self) -> str:
        """The adapter name a new project gets when its folder has the pack's default name."""
        return "pig_" + self.default_folder

    def format_prompt(self, text: str) -> str:
        """The engine's text-to-image string for `text` (no stripping: the engine does none)."""
        if not text and self.t2i_empty is not None:
            return self.t2i_empty
        return self.t2i_template.replace("{text}", text)

    def student_chunks(self, text: str) -> list[str]:
        """The pieces the engine encodes one by one for a text-to-image prompt: the template's
        prefix, the user text split by the attention parse (brackets and weights gone), the
        suffix. The default is the raw prompt alone (PixArt's student reads no template)."""
        return [chunk for chunk, _ in parse_prompt_attention(text)]

    def teacher_prompt(self, text: str) -> str:
        """The string a text teacher tokenizes itself: the template around the prompt as the
        engine's tokenizer reads it (the attention syntax removed; the weights scale rows after
        the adapter, so the target is the unweighted one)."""
        return self.format_prompt(plain_text(text) if text else text)

    # "module:Class" of the pack's real teacher: build_teacher makes it from the teacher material with the
    # placement settings (`placed_teacher`). Placed by `precompute.teacher_mode`, the module defines
    # `choose_mode(root, mode, device, gpu_mem_gib)`, what the teacher takes, and `resident_need_gib(root)`,
    # the GiB a resident teacher needs on the card; placed by `precompute.placement`, `placement_plan`
    # (contract/placement.py's rules; the plan asks the same).
    teacher_class: ClassVar[str] = ""

    @property
    def teacher_module(self) -> str:
        return self.teacher_class.partition(":")[0]

    def placed_teacher(self, project: "ProjectFolder", material_id: str, device: Any,
                       class_path: str | None = None) -> "Teacher":
        """The teacher class at `class_path` (the pack's `teacher_class` by default) made from the material
        `material_id` on `device`, placed by `precompute.teacher_mode` within `precompute.gpu_mem_gib`."""
        module, _, name = (class_path or self.teacher_class).partition(":")
        p = project.settings.precompute
        return getattr(importlib.import_module(module), name)(
            self.require_material(project, material_id), device=device, mode=p.teacher_mode, gpu_mem_gib=p.gpu_mem_gib)

    def teacher_need_gib(self, project: "ProjectFolder") -> float | None:
        """GiB the pack's teacher needs on a card to stay resident (its weights there plus the pack's headroom),
        the figure its `teacher_mode=auto` compares with the card's budget; None when the pack places its
        teacher otherwise or its files are not on disk or not readable yet."""
        if not self.teacher_module or self.teacher_control != "teacher_mode":
            return None
        root = self.resolve_material(project, "teacher")
        if root is None or not Path(root).exists():
            return None
        try:
            return float(importlib.import_module(self.teacher_module).resident_need_gib(root))
        except (OSError, ValueError, KeyError, TypeError):     # a download under way or damaged: the plan estimates
            return None

    def teacher_material_ids(self, project: "ProjectFolder") -> tuple[str, ...]:
        """The materials precompute loads as models (their weights count in the plan)."""
        return ("teacher",)

    def shard_contract_of(self, project: "ProjectFolder") -> str:
        """The contract this project's shards are written under: the pack's, plus what of the settings
        shapes the shards (`invalidating`)."""
        return self.shard_contract

    def ggk_command(self, project: "ProjectFolder") -> str:
        """The engine command line that uses the export (the student file as picked for training)."""
        student = self.resolve_material(project, "student")
        args = self.ggk_args.replace("{gguf}", str(project.gguf_path()))
        args = args.replace("{student}", str(student) if student is not None else STUDENT_FILE)
        return f'ggk diffuser engine -- {self.ggk_model_args} {args} -p "a prompt" -o out.png'

    def adapter_kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        """The pack's KVs of an export of `config` (export_kvs, plus what depends on the trained shapes)."""
        return dict(self.export_kvs)

    def export_arrays(self, project: "ProjectFolder") -> dict[str, list[str]]:
        """String-array KVs an export writes after the adapter's KVs (the Qwen3.5 bridge's vocabulary,
        tokenizer.ggml.tokens and .merges); none by default."""
        return {}

    def export_stale(self, project: "ProjectFolder") -> bool:
        """Whether the export must run again although the GGUF is newer than best.pt (Ming: a vis_bridge
        to fit or write); cheap, the pipeline asks it often."""
        return False

    def prepare_export(self, project: "ProjectFolder", report: Any, should_stop: Any) -> bool:
        """Work the export stage does before writing the adapter (Ming: fit its vis_bridge); False when
        stopped."""
        return True

    def export_tensors(self, project: "ProjectFolder") -> dict[str, Any]:
        """Tensors an export writes after the adapter's under their own names (numpy arrays, written as
        they are): Ming's `tokenizer_json`; none by default. A pack that cannot provide what the engine
        needs raises ModelFileError before anything is written."""
        return {}

    def corpus_draws(self, c: Any, rng: Any, val: list[Any], train: list[Any], entries: Any) -> dict[str, int]:
        """The pack's own draws over an image corpus's planned samples (contract/image_corpus.Sample), made
        after the common ones with the same generator: replace samples of `val` / `train` in place
        (a Klein target, a layer prompt) and return counts for the plan. None by default (no draw, so
        the common corpus is the same for every pack)."""
        return {}

    def corpus_notes(self, counts: Mapping[str, int]) -> list[str]:
        """What the corpus stage's summary adds about the pack's own draws."""
        return []

    def student_states(self, student: Any, text: str) -> Any:
        """The student's rows [L, hidden] (numpy f32) for a prompt, as the engine hands them to the
        adapter (`gguf-trainer infer --prompt`)."""
        ids, mask = student.batch([student.ids(self.student_chunks(text))])
        return student.hidden(ids, mask)[0].cpu().numpy()

    def prompt_inputs(self, adapter: Path, text: str, vis: Any) -> dict[str, Any]:
        """`gguf-trainer infer --prompt`: the adapter's inputs besides the student's rows that the engine
        derives from the prompt (infer option → value, e.g. "--seed-ids"); `vis` the vision rows given, or
        None. None by default."""
        return {}

    def engine_ids(self, student: Any, text: str) -> list[int]:
        """The ids the engine's conditioner runs the student over for a text-to-image prompt (SD_DUMP_COND's
        tokens.txt): the template's pieces by default."""
        return student.ids(self.student_chunks(text))

    def engine_bank(self, version: str) -> bool:
        """Whether the engine's conditioner for the model version `version` (one of engine_versions) hands the DiT
        the adapter's bank head (`gguf-trainer infer --bank`); False by default."""
        return False

    def export_extras(self, project: "ProjectFolder", report: Any) -> None:
        """Files the export stage writes beside the adapter; none by default."""

    def describe_output(self, path: Path, kvs: Mapping[str, Any]) -> dict[str, Any] | None:
        """`gguf-trainer inspect` of a GGUF this pack's export writes beside the adapter: {"kind", "variant",
        "config", "problems" ([{"message", "fatal"}])} when the file at `path` (its KVs `kvs`) is one of them,
        else None; none by default."""
        return None

    def extra_outputs(self, project: "ProjectFolder") -> list[Path]:
        """The files export_extras wrote that exist now (the Output tab lists them)."""
        return []

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """Bytes one sample's shard rows take (bf16): the prompt's student rows and the teacher's rows."""
        tokens = self.prompt_tokens(project, 60)
        return tokens * student_dim * 2 + (dims.get("num_queries") or tokens) * dims["out_dim"] * 2

    def prompt_tokens(self, project: "ProjectFolder", default: float) -> float:
        """The mean length in tokens of the prompts this project's corpus reads (the estimates' prompt, before
        anything is tokenized): measured at CHARS_PER_TOKEN on the corpus the corpus stage wrote, else on the
        prompt files the settings name (corpus.train_file, corpus.extra_files), the first 64 KB of each;
        `default`, the pack's typical prompt of its presets, when none of them can be read."""
        c = project.settings.corpus
        written = [p for p in project.corpus_files()[:1] if p.is_file()]
        named = [project.resolve_user_path(f) for f in (c.train_file, *c.extra_files) if f]
        chars = lines = 0
        for path in written or named:
            if not path.is_file():                  # a folder, a pipe, a device: nothing to sample
                continue
            try:
                with open(path, "rb") as f:
                    text = f.read(_SAMPLE_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            for line in text.split("\n")[:-1] or text.split("\n"):     # the last line may be cut short
                if line.startswith("{"):                                 # an image corpus's jsonl: its text
                    try:
                        line = str(json.loads(line).get("text", ""))
                    except (ValueError, AttributeError):
                        continue
                chars, lines = chars + len(line), lines + 1
        return chars / lines / CHARS_PER_TOKEN if lines else float(default)

    def reference_pixels(self, project: "ProjectFolder") -> int:
        """The most pixels precompute reads one reference image at (the plan's memory estimate): the largest of
        corpus.ref_areas, an area of 0 (the image's own size) counted as a megapixel photo; 0 for a text pack."""
        if self.corpus_kind != "image":
            return 0
        return max((int(area) or 2**20 for area, _ in project.settings.corpus.ref_areas), default=2**20)

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """The demo's tiny teacher under materials/; none by default (the demo runs the mock)."""

    # ------------------------------------------------------------ materials
    def project_materials(self, project: "ProjectFolder") -> tuple[Material, ...]:
        """The pack's materials plus, for image packs, one per image preset the corpus uses."""
        if self.corpus_kind != "image":
            return self.materials
        return self.materials + tuple(IMAGE_PRESET_MATERIALS[p] for p in project.settings.corpus.image_presets
                                      if p in IMAGE_PRESET_MATERIALS)

    def material(self, material_id: str) -> Material:
        for m in self.materials:
            if m.id == material_id:
                return m
        if self.corpus_kind == "image":
            for m in IMAGE_PRESET_MATERIALS.values():
                if m.id == material_id:
                    return m
        raise KeyError(material_id)

    def resolve_material(self, project: "ProjectFolder", material_id: str) -> Path | None:
        """Where a material lives: a path override (picked or linked), else its place under
        materials/ (snapshots); None for a local file nobody picked."""
        override = project.settings.materials.get(material_id)
        if override is not None and override.path:
            return project.resolve_user_path(override.path)
        m = self.material(material_id)
        if m.kind == "hf_snapshot":
            return project.materials_dir / (m.subdir or m.repo.rsplit("/", 1)[-1])
        return None

    def require_material(self, project: "ProjectFolder", material_id: str) -> Path:
        """The material's path, or a UsageError saying how to provide it."""
        m = self.material(material_id)
        path = self.resolve_material(project, material_id)
        if path is None:
            raise UsageError(f"The {m.title} is not set: pick {m.hint or 'the file'} in the Materials "
                             f"section, or `gguf-trainer set --project {project.root} "
                             f"--set materials.{m.id}.path=FILE`.")
        if not path.exists():
            how = (f"download it ({m.repo}) with `gguf-trainer download --project {project.root}`"
                   if m.kind == "hf_snapshot" else "pick the file again")
            raise UsageError(f"The {m.title} is missing: {path} does not exist; {how}.")
        return path

    def material_json(self, project: "ProjectFolder", material_id: str = "teacher",
                      name: str = "config.json") -> dict[str, Any] | None:
        """The JSON object `name` inside a snapshot material; None when that file is absent and the mock teacher
        stands in (the caller then takes the reference shapes); ModelFileError / UsageError saying what to do."""
        from trainer_core.contract.shards import mock_enabled
        path = self.resolve_material(project, material_id) / name
        if not path.is_file() and mock_enabled(project):
            return None
        path = self.require_material(project, material_id) / name
        return read_config_json(path, self.material(material_id).repo or "the teacher")

    # ------------------------------------------------------------ hooks
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """{"out_dim": …, and kind-specific sizes} from the teacher's config."""
        raise StageNotAvailableError(f"The {self.title} teacher is not available in this version yet.")

    def build_teacher(self, project: "ProjectFolder", device: Any) -> "Teacher":
        if self.teacher_class:
            return self.placed_teacher(project, "teacher", device)
        raise StageNotAvailableError(
            f"The {self.title} teacher is not available in this version yet; tick precompute.mock_teacher "
            f"(or set GGUF_TRAINER_MOCK_TEACHER=1) to run the pipeline on synthetic targets.")

    def build_mock_teacher(self, project: "ProjectFolder") -> "Teacher":
        raise StageNotAvailableError(f"The {self.title} pack has no mock teacher in this version yet.")

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        p = project.settings.precompute
        return Budgets(p.teacher_batch or 24, p.tok_budget or 12288, p.student_batch or 64,
                       p.student_tok_budget or (p.student_batch or 64) * self.max_len_student)

    def read_samples(self, project: "ProjectFolder", path: Path) -> list[Any]:
        """The samples of a corpus file, as make_shard takes them (text packs: the prompts)."""
        from trainer_core.contract.corpus_files import read_corpus
        return read_corpus(path)

    def prepare(self, project: "ProjectFolder", student: "Student", teacher: "Teacher", report: Any) -> Any:
        """Once per precompute stage, after the models are loaded: checks and fits that make_shard
        needs; what it returns is handed to every make_shard call."""
        return None

    def make_shard(self, prompts: list[Any], student: "Student", teacher: "Teacher", budgets: Budgets,
                   session: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        raise StageNotAvailableError(f"Precompute for the {self.title} pack is not available in this version yet.")

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        raise StageNotAvailableError(f"Training the {self.title} adapter is not available in this version yet.")

    def load_frozen(self, project: "ProjectFolder", model: Any) -> None:
        """Load the adapter's frozen parts (precompute fitted them) into a freshly built model; none
        by default."""
