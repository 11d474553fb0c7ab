"""The pack seam: what a trainer pack declares, and the hooks the stages call, grouped by stage.

A pack is declarative data — identity, adapter kind, corpus kind, materials, defaults, the engine's template,
export KVs, metric names and how to judge them, the ggk command line — plus at most twenty hooks, each with
a default where one exists. docs/ADDING_A_PACK.md lists them in a table that tests/test_pack_seam.py holds
equal to `HOOKS` below; the class defines no other public method. What is not a hook lives in helpers
(packs/lookup.py: materials, teacher placement, prompt formatting; packs/estimates.py: the plan's figures).

Three optional declarations sit beside the hooks, each an object a pack may give:
`extras` (ExportExtras: files the export writes beside the adapter), `engine` (EngineFacts: the engine's side
of the pack, which bench/'s engine harness and the conformance suite read; no stage does) and
`reference_forward` (the teacher's targets by a plain forward, which the conformance suite compares with the
pack's shards).

Dimensions that come from a model (student hidden size, teacher width, vocab sizes) are read from the
materials' configs when the stages run, never hard-coded, so the same code runs the real shapes and the tiny
ones of the tests and the demo. See docs/PACKS.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from trainer_core.base.config import PackSetting
from trainer_core.base.errors import StageNotAvailableError
from trainer_core.contract.corpus_kinds import TEXT, CorpusKind
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.declarations import (CHARS_PER_TOKEN, DEMO_SETTINGS, IMAGE_PRESET_MATERIALS, NO_EXTRAS,
                                             PIG_CLIP_WIDTH, QWEN_PAD_ID, STUDENT_FILE, STUDENT_MATERIALS, Budgets,
                                             EngineFacts, ExportContents, ExportExtras, Material)
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:  # the stages import torch; the registry stays light
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.contract.roles import Student, Teacher

__all__ = ["TrainerPack", "Material", "Budgets", "EngineFacts", "ExportContents", "ExportExtras", "HOOKS",
           "STUDENT_MATERIALS", "IMAGE_PRESET_MATERIALS", "STUDENT_FILE", "PIG_CLIP_WIDTH", "CHARS_PER_TOKEN",
           "DEMO_SETTINGS", "QWEN_PAD_ID"]


# The hooks, by stage: the names and one line each, in the order docs/ADDING_A_PACK.md's table lists them.
HOOKS: dict[str, tuple[tuple[str, str], ...]] = {
    "materials": (
        ("project_materials", "the materials this project needs (default: the pack's, plus the corpus's images)"),
    ),
    "prompt": (
        ("student_chunks", "the pieces the engine tokenizes one by one for a text-to-image prompt"),
        ("student_states", "the student's rows for a prompt, as the engine hands them to the adapter (infer)"),
        ("prompt_inputs", "the adapter's other infer inputs the engine derives from a prompt (seed ids)"),
    ),
    "teacher": (
        ("teacher_dims", "the teacher's shapes (out_dim and kind-specific sizes) read from its config"),
        ("build_teacher", "the real teacher, loaded once per precompute process (default: teacher_class, placed)"),
        ("build_mock_teacher", "deterministic synthetic targets of the same shapes, with no file"),
    ),
    "corpus": (
        ("corpus_draws", "the pack's own draws over an image corpus's samples, and what the summary says of them"),
    ),
    "shards": (
        ("shard_contract_of", "the CONTRACT this project's shards are written under (the pack's, plus settings)"),
        ("budgets", "batch sizes and token budgets of a precompute run on a device"),
        ("prepare", "once per precompute process: checks and fits; what it returns goes to every make_shard"),
        ("make_shard", "one shard's tensors and metadata from its samples, the student and the teacher"),
        ("shard_bytes", "the disk one sample's shard rows take, from the pack's shapes (the plan's estimate)"),
    ),
    "adapter": (
        ("adapter_config", "the adapter the train stage builds, from the settings and the teacher's dims"),
        ("load_frozen", "the adapter's frozen parts (fitted by prepare) into a freshly built model"),
    ),
    "export": (
        ("export_contents", "the KVs, string arrays and top-level tensors an export writes besides the network"),
        ("ggk_command", "the engine command line that uses the export"),
    ),
    "demo": (
        ("build_demo_materials", "the demo's tiny teacher (and images) under materials/"),
    ),
}


@dataclass(frozen=True)
class TrainerPack:
    id: str                       # "llada_image"
    title: str                    # shown in the New project form
    description: str              # one paragraph for the GUI and `gguf-trainer packs`
    adapter_kind: str             # a registered adapter kind (contract/kinds/)
    default_folder: str           # project folder (and adapter name without "pig_")
    shard_contract: str           # the CONTRACT string precomputed shards are written under
    teacher_repo: str             # Hugging Face repo of the teacher
    corpus_kind: CorpusKind = TEXT          # text prompts or image records (contract/corpus_kinds.py)
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
    teacher_control: str = "teacher_mode"   # the precompute setting that places the teacher ("placement")
    reference_dims: Mapping[str, int] = field(default_factory=dict)  # the real teacher's shapes, for estimates
    reference_side: int = 0                # the engine reads references within side² pixels (0: at ref_areas)
    settings: tuple[PackSetting, ...] = ()  # settings only this pack has (config.pack_setting): their parser,
                                           # default and help; the GUI shows them for it alone
    demo_settings: tuple[str, ...] = ()    # the demo project's settings over DEMO_SETTINGS
    invalidating: tuple[str, ...] = ()     # settings of this pack whose change makes the shards stale
    order: int = 100                       # where the GUI lists it (ascending; then by id)
    demo_order: int = 0                    # where it is among the demos (ascending); 0 = it has no demo
    judge: EvalGuide | None = None         # how to read its eval.json: the metric to judge by, the published
                                           # figures and their source (packs/eval_guide.py)
    extras: ExportExtras = NO_EXTRAS        # files the export writes beside the adapter
    engine: EngineFacts | None = None       # the engine's side, for bench/ and the conformance suite
    # the teacher's targets by a plain forward (reference_forward(project, samples) -> one [rows, out_dim] tensor
    # per sample, the rows make_shard stores), written apart from the teacher: the conformance suite compares
    reference_forward: Callable[["ProjectFolder", list[Any]], list[Any]] | None = None
    # "module:Class" of the pack's real teacher: build_teacher makes it from the teacher material with the
    # placement settings (lookup.placed_teacher). Placed by `precompute.teacher_mode`, the module defines
    # `choose_mode(root, mode, device, gpu_mem_gib)`, what the teacher takes, and `resident_need_gib(root)`,
    # the GiB a resident teacher needs on the card; placed by `precompute.placement`, `placement_plan`
    # (contract/placement.py's rules; the plan asks the same). A family base sets its default.
    teacher_class: str = ""

    def __post_init__(self) -> None:
        from trainer_core.contract.kinds import kind_names
        if self.adapter_kind not in kind_names():
            raise ValueError(f"pack {self.id}: unknown adapter kind {self.adapter_kind!r}; the registered kinds "
                             f"are {', '.join(kind_names())}")
        if not isinstance(self.corpus_kind, CorpusKind):
            raise ValueError(f"pack {self.id}: corpus_kind must be a CorpusKind (contract/corpus_kinds.py), "
                             f"not {self.corpus_kind!r}")
        unknown = [k for k in (self.judge.keys() if self.judge else ()) if k not in self.metric_names]
        if unknown:
            raise ValueError(f"pack {self.id}: its judge names {unknown}, which are not among its metric_names")

    # ------------------------------------------------------------ materials
    def project_materials(self, project: "ProjectFolder") -> tuple[Material, ...]:
        """The pack's materials plus, when the corpus reads reference images, one per image preset it uses."""
        if not self.corpus_kind.reference_images:
            return self.materials
        return self.materials + tuple(IMAGE_PRESET_MATERIALS[p] for p in project.settings.corpus.image_presets
                                      if p in IMAGE_PRESET_MATERIALS)

    # ------------------------------------------------------------ the engine's prompt
    def student_chunks(self, text: str) -> list[str]:
        """The pieces the engine encodes one by one for a text-to-image prompt: the template's prefix, the user
        text split by the attention parse (brackets and weights gone), the suffix. The default is the raw
        prompt alone (PixArt's student reads no template)."""
        return [chunk for chunk, _ in parse_prompt_attention(text)]

    def student_states(self, student: "Student", text: str) -> Any:
        """The student's rows [L, hidden] (numpy f32) for a prompt, as the engine hands them to the adapter
        (`gguf-trainer infer --prompt`)."""
        ids, mask = student.batch([student.ids(self.student_chunks(text))])
        return student.hidden(ids, mask)[0].cpu().numpy()

    def prompt_inputs(self, project: "ProjectFolder | None", adapter: Path, text: str, vis: Any) -> dict[str, Any]:
        """`gguf-trainer infer --prompt`: the adapter's inputs besides the student's rows that the engine
        derives from the prompt (infer option → value, e.g. "--seed-ids", "--t5-ids"), from the adapter file and,
        with `--project`, the project's materials (None without); `vis` the vision rows given, or None. None by
        default."""
        return {}

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """{"out_dim": …, and kind-specific sizes} from the teacher's config (the reference shapes when the
        teacher is mocked and not on disk)."""
        raise StageNotAvailableError(f"The {self.title} teacher is not available in this version yet.")

    def build_teacher(self, project: "ProjectFolder", device: Any) -> "Teacher":
        """The real teacher on `device` (contract/roles.py's Teacher), loaded once per precompute process."""
        if self.teacher_class:
            from trainer_core.packs.lookup import placed_teacher
            return placed_teacher(project, "teacher", device)
        raise StageNotAvailableError(
            f"The {self.title} teacher is not available in this version yet; tick precompute.mock_teacher "
            f"(or set GGUF_TRAINER_MOCK_TEACHER=1) to run the pipeline on synthetic targets.")

    def build_mock_teacher(self, project: "ProjectFolder") -> "Teacher":
        raise StageNotAvailableError(f"The {self.title} pack has no mock teacher in this version yet.")

    # ------------------------------------------------------------ corpus
    def corpus_draws(self, c: Any, rng: Any, val: list[Any], train: list[Any], entries: Any
                     ) -> tuple[dict[str, int], list[str]]:
        """The pack's own draws over an image corpus's planned samples (contract/image_corpus.Sample), made after
        the common ones with the same generator: replace samples of `val` / `train` in place (a bank target, a
        layer prompt); returns (counts for the plan, lines for the corpus summary). None by default (no draw,
        so the common corpus is the same for every pack)."""
        return {}, []

    # ------------------------------------------------------------ shards
    def shard_contract_of(self, project: "ProjectFolder") -> str:
        """The contract this project's shards are written under: the pack's, plus what of the settings shapes
        the shards (`invalidating`)."""
        return self.shard_contract

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        p = project.settings.precompute
        return Budgets(p.teacher_batch or 24, p.tok_budget or 12288, p.student_batch or 64,
                       p.student_tok_budget or (p.student_batch or 64) * self.max_len_student)

    def prepare(self, project: "ProjectFolder", student: "Student", teacher: "Teacher", report: Any) -> Any:
        """Once per precompute stage, after the models are loaded: checks and fits that make_shard
        needs; what it returns is handed to every make_shard call."""
        return None

    def make_shard(self, samples: list[Any], student: "Student", teacher: "Teacher", budgets: Budgets,
                   session: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, {"prompts": the samples' texts in stored order, "num_queries", "truncated_student", "meta"}):
        the shard schema of the pack's adapter kind (docs/SHARDS.md)."""
        raise StageNotAvailableError(f"Precompute for the {self.title} pack is not available in this version yet.")

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """Bytes one sample's shard rows take (bf16): the prompt's student rows and the teacher's rows."""
        from trainer_core.packs.estimates import prompt_tokens
        tokens = prompt_tokens(project, 60)
        return tokens * student_dim * 2 + (dims.get("num_queries") or tokens) * dims["out_dim"] * 2

    # ------------------------------------------------------------ adapter
    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        """The adapter to train (dims: the teacher's, read from its config unless given; the plan gives
        reference_dims)."""
        raise StageNotAvailableError(f"Training the {self.title} adapter is not available in this version yet.")

    def load_frozen(self, project: "ProjectFolder", model: Any) -> None:
        """Load the adapter's frozen parts (precompute fitted them) into a freshly built model; none by default."""

    # ------------------------------------------------------------ export
    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        """What an export of `config` writes besides the network: export_kvs by default. A pack that cannot
        provide what the engine needs raises ModelFileError before anything is written."""
        return ExportContents(kvs=dict(self.export_kvs))

    def ggk_command(self, project: "ProjectFolder") -> str:
        """The engine command line that uses the export (the student file as picked for training)."""
        from trainer_core.packs.lookup import resolve_material
        student = resolve_material(project, "student")
        args = self.ggk_args.replace("{gguf}", str(project.gguf_path()))
        args = args.replace("{student}", str(student) if student is not None else STUDENT_FILE)
        return f'ggk diffuser engine -- {self.ggk_model_args} {args} -p "a prompt" -o out.png'

    # ------------------------------------------------------------ demo
    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """The demo's tiny teacher under materials/; none by default (the demo runs the mock)."""
