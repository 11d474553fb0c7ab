"""Qwen3.5-9B bridge: one adapter for MOSS-Image and for FLUX.3 Klein's prompt upsampler.

MOSS-Image conditions its DiT on Qwen3.5-9B's last hidden state over a chat template (references
enter through the Qwen3.5 vision tower); FLUX.3 Klein was trained on captions a Qwen3.5-9B upsampler
wrote. The `qwen35_bridge` adapter reads pig_clip's rows of the raw prompt and emits one row per
Qwen3.5 token of the MOSS template (a seeded slot each: slot query + PCA seed of the Qwen3.5 id +
the raw vision embed under image slots), plus, with `train.klein_head`, a fixed bank of
`train.bank_slots` rows aligned to the prompt (row 3 + i ↔ student token i) that gives FLUX.3
Klein's 20480-d conditioning. The Qwen3.5 vocabulary rides in the GGUF (`tokenizer.ggml.*`,
pre = "qwen35"): the engine tokenizes the MOSS template with it. packs-contract-more §D.2, Part F.

Only the prompt-aligned bank (ggk ≥ 0.9.4) is built; the legacy caption bank (a Qwen3.5 upsampler's
caption as the Klein target) is not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.base.config import pack_setting
from trainer_core.base.errors import ModelFileError
from trainer_core.base.parsers import boolean, count
from trainer_core.packs.common.slot_settings import SLOT_SETTINGS
from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, EngineFacts, ExportContents, Material
from trainer_core.packs.common.flux3_klein import taps_for
from trainer_core.packs.common.qwen_chat import check_chat_template
from trainer_core.packs.estimates import prompt_tokens
from trainer_core.packs.lookup import material_json, placed_teacher, resolve_material
from trainer_core.packs.qwen35_bridge.reference import moss_reference
from trainer_core.packs.common.qwen3vl.vision_pack import DEMO_IMAGES, IMAGE_DEMO_SETTINGS, VisionPack, qwen3vl_teacher
from trainer_core.packs.eval_guide import EvalGuide

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

__all__ = ["PACK", "BridgePack", "TEACHER", "KLEIN_ENCODER"]

OUT_DIM, VIS_DIM, SEED_VOCAB, BANK_DIM = 4096, 4096, 248320, 20480     # Qwen3.5-9B, 8 × 2560 (the 4B's taps)
KLEIN_LAYERS = "4,8,12,16,20,24,28,32"
# the disk estimate: ~25 slots of template and ~20 student rows a text sample, 192 tokens a reference
_TEXT_SLOTS, _STUDENT_ROWS, _REF_TOKENS, _KLEIN_ROWS = 25, 20, 192, 81

TEACHER = Material(
    "teacher", "Qwen3.5-9B (teacher)", "hf_snapshot", repo="Qwen/Qwen3.5-9B",
    patterns=("config.json", "model.safetensors.index.json", "model*.safetensors", "preprocessor_config.json",
              "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja"),
    subdir="Qwen3.5-9B", size_hint="~19 GB", model=True,
    hint="bf16 with its vision tower; resident it needs about 22 GB of GPU memory, smaller cards stream it from "
         "RAM; its tokenizer also goes into the adapter")
KLEIN_ENCODER = qwen3vl_teacher("Qwen3-VL-4B-Instruct", "~8.3 GB", "only with train.klein_head: its text stack gives "
                                "the Klein bank's targets", "klein_encoder", "FLUX.3 Klein target", vision=False)


@dataclass(frozen=True)
class BridgePack(VisionPack):
    teacher_class: str = "trainer_core.packs.qwen35_bridge.teacher:Qwen35Teacher"
    """A VisionPack for its image corpus, reading of samples and materials; everything else its own."""

    invalidating: tuple[str, ...] = ("train.max_slots", "train.klein_head", "train.bank_slots")

    def student_chunks(self, text: str) -> list[str]:
        """The raw prompt, one chunk, no attention parse (the engine's bridge path)."""
        return [text]

    def shard_contract_of(self, project: "ProjectFolder") -> str:
        t = project.settings.train
        return f"{self.shard_contract}+prompt slots{t.max_slots} bank{t.bank_slots if t.klein_head else 0}"

    def project_materials(self, project: "ProjectFolder") -> tuple[Material, ...]:
        """The Klein encoder only while the Klein head is on."""
        found = super().project_materials(project)
        return found if project.settings.train.klein_head else tuple(m for m in found if m.id != "klein_encoder")

    # ------------------------------------------------------------ teacher
    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """Qwen3.5's text width (out_dim), vision output (vis_dim) and vocabulary (seed_vocab); the Klein
        encoder's 8 taps × width (bank_dim) when the head is on. Reference shapes when mocked with no file."""
        dims = dict(self.reference_dims)
        config = material_json(project, "teacher")
        try:
            if config is not None:
                text = config.get("text_config", config)
                dims.update(out_dim=int(text["hidden_size"]), seed_vocab=int(text["vocab_size"]),
                            vis_dim=int(config["vision_config"]["out_hidden_size"]))
            klein = material_json(project, "klein_encoder") if project.settings.train.klein_head else None
            if klein is not None:
                kt = klein["text_config"]
                dims["bank_dim"] = int(kt["hidden_size"]) * len(taps_for(int(kt["num_hidden_layers"])))
        except (KeyError, TypeError, ValueError):
            raise ModelFileError("The Qwen3.5 or Qwen3-VL config lacks hidden_size / vocab_size / "
                                 "vision_config.out_hidden_size / num_hidden_layers; download the teacher "
                                 "again.") from None
        return dims

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.qwen35_bridge.teacher import MockQwen35Teacher
        dims = self.teacher_dims(project)
        tokenizer = resolve_material(project, "teacher") / "tokenizer.json"
        return MockQwen35Teacher(dims["out_dim"], dims["vis_dim"], tokenizer if tokenizer.is_file() else None)

    def _klein_teacher(self, project: "ProjectFolder", teacher: Any) -> Any:
        from trainer_core.contract.shards import mock_enabled
        if mock_enabled(project):
            from trainer_core.packs.common.qwen3vl.taps_teacher import MockTapsTeacher
            dims = self.teacher_dims(project)
            config = material_json(project, "klein_encoder")
            n_layers = int(config["text_config"]["num_hidden_layers"]) if config else 36
            return MockTapsTeacher(dims["bank_dim"], taps_for(n_layers))
        return placed_teacher(project, "klein_encoder", getattr(teacher, "device", "cpu"),
                              "trainer_core.packs.common.qwen3vl.taps_teacher:TapsTeacher", taps_of=taps_for,
                              family="FLUX.3 Klein")

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.common.qwen3vl.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device, self.budget_scale)
        big = getattr(device, "type", "cpu") == "cuda" and auto["teacher_batch"] >= 256
        return Budgets(p.teacher_batch or (32 if big else 8), p.tok_budget or (6144 if big else 2048),
                       p.student_batch or auto["student_batch"], p.student_tok_budget or auto["student_tok_budget"],
                       p.vis_tok_budget or (4096 if big else 1024))

    # ------------------------------------------------------------ precompute
    def prepare(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> Any:
        """Check the teacher's MOSS template (and the Klein template on both tokenizers), fit or reuse the
        seed table, load the Klein teacher when the head is on."""
        from trainer_core.packs.qwen35_bridge.shards import BridgeSession
        from trainer_core.packs.qwen35_bridge.template import check_template
        t, c = project.settings.train, project.settings.corpus
        encode = teacher.encode
        check_template(encode, "teacher")
        self._seed_table(project, teacher, report)
        klein = None
        if t.klein_head:
            check_chat_template(student.tokenize, "student")
            klein = self._klein_teacher(project, teacher)
            tok = getattr(klein, "tokenizer", None)
            if tok is not None:
                check_chat_template(lambda s: tok.encode(s, add_special_tokens=False).ids, "Klein encoder")
        log = lambda m: report("log", level="warning", message=m)  # noqa: E731
        return BridgeSession(encode, c.ref_areas, c.two_image_max_area, t.max_slots,
                             t.bank_slots if t.klein_head else 0, klein, log)

    def _seed_table(self, project: "ProjectFolder", teacher: Any, report: Any) -> None:
        from trainer_core.packs.common.seed_table import ensure_seed_table
        ensure_seed_table(project.root / "seed_table.pt", self.teacher_dims(project)["seed_vocab"],
                          project.settings.train.seed_rank, self.id, teacher, report, self.teacher_repo)

    def make_shard(self, prompts: list[Any], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        from trainer_core.packs.qwen35_bridge.shards import build_shard
        return build_shard(prompts, student, teacher, budgets, session, self.max_len_student)

    # ------------------------------------------------------------ train / export
    def corpus_draws(self, c: Any, rng: Any, val: list[Any], train: list[Any], entries: Any
                     ) -> tuple[dict[str, int], list[str]]:
        """corpus.n_val_klein / n_klein samples of each split (image and text alike) also get a FLUX.3 Klein
        target; at 0 nothing is drawn."""
        from trainer_core.contract.image_corpus import Sample
        for split, n in ((val, c.n_val_klein), (train, c.n_klein)):
            if n:
                for row in rng.sample(range(len(split)), min(n, len(split))):
                    split[row] = Sample(split[row].text, split[row].images, True)
        return {}, []

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("qwen35_bridge", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width, depth=t.depth,
                             seed_vocab=dims["seed_vocab"], seed_rank=t.seed_rank, vis_dim=dims["vis_dim"],
                             max_slots=t.max_slots, n_bank=t.bank_slots if t.klein_head else 0,
                             bank_dim=dims["bank_dim"] if t.klein_head else 0, bank_align=True)

    def load_frozen(self, project: "ProjectFolder", model: Any) -> None:
        """The seed table precompute fitted, into the frozen seed_embed."""
        from trainer_core.packs.common.seed_table import load_seed_into
        load_seed_into(project.root / "seed_table.pt", model, self.id)

    def export_contents(self, project: "ProjectFolder", config: "AdapterConfig") -> ExportContents:
        """The bridge's KVs, and the Qwen3.5 vocabulary and merges the engine tokenizes the MOSS template with."""
        return ExportContents(kvs=self._kvs(config), arrays=self._vocabulary(project))

    def _kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        bank = config.n_bank > 0
        return {"adapter.kind": "qwen35_bridge", "adapter.n_bank": config.n_bank, "adapter.bank_dim": config.bank_dim,
                "adapter.bank_align": int(config.bank_align), "adapter.max_slots": config.max_slots,
                "adapter.seed_rank": config.seed_rank, "adapter.seed_vocab": config.seed_vocab,
                "adapter.vis_dim": config.vis_dim, **self.export_kvs,
                "adapter.bank_target": "prompt" if bank else "",
                "adapter.target": "moss_image rows (Qwen3.5-9B last hidden state per template token, "
                                  f"{config.out_dim})" + (f" + flux3 klein bank (Qwen3-VL-4B layers 4..32 of the "
                                                          f"prompt as typed (token-aligned), {config.bank_dim})"
                                                          if bank else "")}

    def _vocabulary(self, project: "ProjectFolder") -> dict[str, list[str]]:
        from trainer_core.packs.qwen35_bridge.teacher import tokenizer_arrays
        path = resolve_material(project, "teacher") / "tokenizer.json"
        if not path.is_file():
            raise ModelFileError(f"The adapter must carry the Qwen3.5 vocabulary but {path} is missing; download "
                                 f"the teacher ({self.teacher_repo}) — its tokenizer.json is enough — then export "
                                 "again.")
        tokens, merges = tokenizer_arrays(path, self.teacher_dims(project)["seed_vocab"])
        return {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges}

    def prompt_inputs(self, project: "ProjectFolder | None", adapter: Path, text: str, vis: Any) -> dict[str, Any]:
        """The Qwen3.5 ids of the MOSS template around the prompt (the vocabulary the adapter carries), and the
        input image's run of slots when vision rows are given."""
        from trainer_core.packs.qwen35_bridge.template import seed_ids_from_file
        ids, runs = seed_ids_from_file(adapter, text, () if vis is None else (vis.shape[0],))
        return {"--seed-ids": ids, **({"--vis-pos": runs} if vis is not None else {})}

    def student_states(self, student: Any, text: str) -> Any:
        ids, mask = student.batch([student.tokenize(text)])
        return student.hidden(ids, mask)[0].cpu().numpy()

    def ggk_command(self, project: "ProjectFolder") -> str:
        """The MOSS-Image line; with the Klein head also FLUX.3 Klein's, as ggk's prompt-upsampler front end
        hands it to the engine (the adapter in place of the Qwen3-VL-4B encoder, 4 steps, cfg 1)."""
        moss = super().ggk_command(project)
        if not project.settings.train.klein_head:
            return moss
        klein = (moss.replace(self.ggk_model_args, "--diffusion-model flux3-image-klein-nvfp4.gguf --vae "
                                                   "pig_flux2_vae_fp32-f16.gguf")
                 .replace("--sampling-method", "--cfg-scale 1 --steps 4 --sampling-method"))
        return moss + "\n" + klein

    def shard_bytes(self, project: "ProjectFolder", dims: Mapping[str, int], student_dim: int) -> float:
        """Per sample: the student's rows, a slot row per template token, the raw vision rows of its
        references (their slots' targets too), and a Klein sample's bank rows, over the corpus mix (the text's
        length from the prompt files, a reference's slots from corpus.ref_areas)."""
        from trainer_core.packs.common.qwen3vl.qwenimage_data import mean_slots
        c, t = project.settings.corpus, project.settings.train
        samples = c.n_image + c.n_two + c.n_text + c.n_val_image + c.n_val_text
        refs = c.n_image + c.n_val_image + 2 * c.n_two
        text = prompt_tokens(project, _STUDENT_ROWS)
        per = (text * student_dim + (_TEXT_SLOTS - _STUDENT_ROWS + text) * dims["out_dim"]) * 2
        vis = refs * mean_slots(c.ref_areas, _REF_TOKENS) * (dims["out_dim"] + dims["vis_dim"]) * 2
        klein = (c.n_klein + c.n_val_klein) * _KLEIN_ROWS * dims.get("bank_dim", BANK_DIM) * 2 if t.klein_head else 0
        return per + (vis + klein) / max(samples, 1)

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny random Qwen3.5 (with a small Qwen3.5-format tokenizer), a tiny Qwen3-VL for the Klein head,
        and generated captioned scenes."""
        from trainer_core.packs.common.tiny_models import write_demo_images
        from trainer_core.packs.qwen35_bridge.tiny import write_tiny_qwen35
        from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
        write_tiny_qwen35(resolve_material(project, "teacher"))
        write_tiny_qwen3vl(resolve_material(project, "klein_encoder"), layers=9)
        write_demo_images(project.materials_dir / "demo_images", DEMO_IMAGES)


PACK = BridgePack(
    id="qwen35_bridge",
    order=50,
    demo_order=6,
    title="Qwen3.5-9B bridge (MOSS-Image + FLUX.3 Klein upsampler → seeded slots + bank)",
    description=(
        "Replaces Qwen3.5-9B for MOSS-Image (its last hidden state per chat-template token, references "
        "through the unchanged mmproj-qwen3.5-9b vision tower) with pig_clip and a seeded-slot resampler; "
        "optionally a prompt-aligned bank also gives FLUX.3 Klein's conditioning (the prompt upsampler "
        "path). The Qwen3.5 vocabulary rides in the adapter. Needs ggk 0.9.4 or later."
    ),
    adapter_kind="qwen35_bridge",
    default_folder="qwen3.5_9b_adapter",
    shard_contract="qwen35_bridge/1",
    teacher_repo="Qwen/Qwen3.5-9B",
    defaults={
        "corpus": {"image_presets": ["flickr30k"], "n_image": 8000, "n_two": 400, "n_text": 16000,
                   "n_val_image": 256, "n_val_text": 384, "empty_frac": 0.015,
                   "ref_areas": [[0, 0.40], [262144, 0.30], [589824, 0.20], [1048576, 0.10]],
                   "n_klein": 6000, "n_val_klein": 128},
        "precompute": {"shard_size": 256, "val_shard_size": 128, "teacher_batch": 0, "tok_budget": 0,
                       "student_batch": 0, "student_tok_budget": 0, "vis_tok_budget": 0, "teacher_mode": "auto"},
        "train": {"width": 1024, "depth": 6, "steps": 20000, "batch_size": 32, "seed_rank": 384, "max_slots": 2304,
                  "klein_head": True, "bank_slots": 240, "batch_tokens": 20480, "sigma_floor": 0.03},
    },
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.teacher": "Qwen/Qwen3.5-9B",
        "adapter.student_prompt": "raw_text",
        "adapter.vision": "qwen3.5 vision tower (mmproj-qwen3.5-9b), raw main output",
        "adapter.bank_layers": KLEIN_LAYERS,
        "adapter.bank_teacher": "Qwen/Qwen3-VL-4B-Instruct",
    },
    ggk_min_version="0.9.4",
    budget_scale=0.5,
    max_len_student=4096,
    materials=STUDENT_MATERIALS + (TEACHER, KLEIN_ENCODER),
    metric_names=("cos_centered_moss", "cos_centered_klein", "cos_rms_moss", "cos_rms_klein", "cos_raw_moss",
                  "cos_raw_klein", "cos_centered", "cos_rms", "rel_mse", "worst_row_cos_rms", "roundtrip_cos",
                  "val_batches", "klein_batches", "val_samples"),
    judge=EvalGuide(
        headline="cos_centered_moss", also=("cos_centered_klein", "rel_mse"),
        good="judge the MOSS slots by cos_centered_moss and the FLUX.3 Klein bank by cos_centered_klein",
        source="none: no reference run is published; a known failure signature is a caption-target run's centred "
               "bank cos 0.59 that is 0.47 against other samples' targets (the bank ignored the prompt)"),
    engine=EngineFacts(versions=("moss_image", "flux3"), bank_versions=("flux3",), raw_prompt=True,
                       references="mmproj",
                       reference_reader="trainer_core.packs.qwen35_bridge.template:load_reference"),
    reference_forward=moss_reference,
    ggk_model_args="--diffusion-model moss-image-sft-nvfp4.gguf --vae pig_flux2_vae_fp32-f16.gguf",
    ggk_args=("--llm {student} --llm-adapter {gguf} --llm_vision mmproj-qwen3.5-9b-f16.gguf --ref-image sheep.png "
              "--sampling-method euler --diffusion-fa"),
    reference_dims={"out_dim": OUT_DIM, "vis_dim": VIS_DIM, "seed_vocab": SEED_VOCAB, "bank_dim": BANK_DIM},
    settings=(*SLOT_SETTINGS,
              pack_setting("train.klein_head", True, boolean,
                           "also train the FLUX.3 Klein bank (the prompt upsampler's target)"),
              pack_setting("train.bank_slots", 240, count(80, multiple_of=80),
                           "rows of the Klein bank, a multiple of 80"),
              pack_setting("corpus.n_klein", 0, count(0),
                           "training samples (image and text alike) that also get a FLUX.3 Klein target"),
              pack_setting("corpus.n_val_klein", 0, count(0), "validation samples with a FLUX.3 Klein target")),
    # the demo's references at their own size or 256²: 64-ish tokens each, the whole run in ~35 s
    demo_settings=(*IMAGE_DEMO_SETTINGS, "corpus.n_klein=40", "corpus.n_val_klein=8",
                   "corpus.ref_areas=[[0, 0.7], [65536, 0.3]]", "train.seed_rank=16", "train.max_slots=640",
                   "train.bank_slots=80", "train.batch_tokens=0", "train.batch_size=8"),
)
