"""LLaDA-Image-Turbo: the 16B LLaDA2-MoE text stack → pig_clip + a 256-query resampler."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.base.config import pack_setting
from trainer_core.base.parsers import boolean
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, EngineFacts, Material, TrainerPack
from trainer_core.packs.llada_image.export import SigVQExtras
from trainer_core.packs.lookup import require_material, resolve_material, teacher_prompt

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.kinds import AdapterConfig

from trainer_core.packs.llada_image.template import (EMPTY, MAX_LEN_TEACHER, NUM_QUERIES, OUT_DIM, PREFIX, SUFFIX,
                                                     TEMPLATE)
from trainer_core.packs.eval_guide import EvalGuide

TEACHER = Material(
    "teacher", "LLaDA-Image-Turbo text encoder, QueryFormer, text_projection, tokenizer (teacher)",
    "hf_snapshot", repo="inclusionAI/LLaDA-Image-Turbo",
    patterns=("model_index.json", "text_encoder/*", "queryformer/*", "text_projection/*", "tokenizer/*"),
    subdir="LLaDA-Image-Turbo", size_hint="~33 GB", model=True,
    hint="needs ~34 GB of combined GPU + CPU memory to run")
SIGVQ = Material("sigvq", "SigVQ vision encoder (exported beside the adapter)", "hf_snapshot",
                 repo="inclusionAI/LLaDA-Image-Turbo", patterns=("sigvq/*",), subdir="LLaDA-Image-Turbo",
                 wanted_if="export.export_sigvq",
                 required=False, size_hint="~2.4 GB")


@dataclass(frozen=True)
class LLaDAPack(TrainerPack):
    teacher_class: str = "trainer_core.packs.llada_image.teacher:LLaDATeacher"     # placed by precompute.placement

    def student_chunks(self, text: str) -> list[str]:
        """PREFIX | " " + text, attention-parsed | SUFFIX; the empty prompt is EMPTY in one piece."""
        if not text:
            return [EMPTY]
        return [PREFIX, *(chunk for chunk, _ in parse_prompt_attention(" " + text)), SUFFIX]

    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """projection_dim and num_queries of the snapshot's text_projection / queryformer configs
        (the reference shape when the teacher is mocked and not downloaded)."""
        from trainer_core.contract.shards import mock_enabled
        from trainer_core.packs.llada_image.teacher import teacher_dims
        root = resolve_material(project, "teacher")
        if not (root / "text_projection" / "config.json").is_file() and mock_enabled(project):
            return dict(self.reference_dims)
        dims = teacher_dims(require_material(project, "teacher"))
        return {"out_dim": dims["out_dim"], "num_queries": dims["num_queries"]}

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        from trainer_core.packs.llada_image.teacher import LLaDATeacher
        p = project.settings.precompute
        return LLaDATeacher(require_material(project, "teacher"), device=device, placement=p.placement,
                            gpu_mem_gib=p.gpu_mem_gib, cpu_mem_gib=p.cpu_mem_gib)

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.llada_image.teacher import MockLLaDATeacher
        dims = self.teacher_dims(project)
        return MockLLaDATeacher(dims["out_dim"], dims["num_queries"])

    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Resampler layout: every prompt supervises all `num_queries` rows. The teacher runs in
        greedy batches of the length-sorted prompts, a prompt counting its teacher tokens plus
        the queries (§A.5); the shard keeps that order."""
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        formatted = [teacher_prompt(self, p) for p in prompts]
        lens = teacher.text_lens(formatted)
        order = sorted(range(len(prompts)), key=lens.__getitem__)           # stable: by teacher length
        prompts, formatted = [prompts[i] for i in order], [formatted[i] for i in order]
        sizes = [lens[i] + teacher.num_queries for i in order]
        # the batches' rows written straight into the shard's tensor (batches run in sample order):
        # a list of batch outputs and a cat would hold the 1.3 MB a prompt twice
        t: torch.Tensor | None = None                                       # [S, NQ, out] bf16
        at = 0
        for batch in greedy_batches(sizes, budgets.teacher_batch, budgets.tok_budget):
            rows = teacher.forward_prompts([formatted[i] for i in batch])   # [b, NQ, out]
            if t is None:
                t = torch.empty(len(prompts), *rows.shape[1:], dtype=torch.bfloat16)
            t[at:at + len(batch)] = rows
            at += len(batch)
            del rows
        assert t is not None and at == t.shape[0]                            # a shard has at least one prompt
        tokens, q_rows, truncated = student.rows([student.ids(self.student_chunks(p)) for p in prompts],
                                                 self.max_len_student, budgets.student_batch,
                                                 budgets.student_tok_budget)
        t_pack = t.reshape(-1, t.shape[-1])
        tensors = {
            "ids": torch.tensor([i for ids in tokens for i in ids], dtype=torch.int32),
            "len": torch.tensor([len(ids) for ids in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows), "t_pack": t_pack,
            "t_len": torch.full((len(prompts),), t.shape[1], dtype=torch.int32),
            **target_moments(t_pack),
        }
        return tensors, {"prompts": prompts, "num_queries": int(t.shape[1]), "truncated_student": truncated,
                         "truncated_teacher": sum(n >= MAX_LEN_TEACHER for n in lens)}

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("resampler", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, num_queries=dims["num_queries"])

    # ------------------------------------------------------------ export: the SigVQ beside the adapter
    def ggk_command(self, project: "ProjectFolder") -> str:
        from trainer_core.packs.llada_image.export import sigvq_path
        return super().ggk_command(project).replace("{sigvq}", str(sigvq_path(project)))

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """The mock teacher stands in; a small random SigVQ file makes the export write its GGUF too."""
        from trainer_core.packs.llada_image.tiny import write_tiny_sigvq
        write_tiny_sigvq(resolve_material(project, "sigvq"))


PACK = LLaDAPack(
    id="llada_image",
    order=10,
    demo_order=2,
    title="LLaDA-Image-Turbo (LLaDA2-MoE 16B → 256-query resampler)",
    description=(
        "Replaces the 16B LLaDA2-MoE text encoder of LLaDA-Image-Turbo with pig_clip and a "
        "seedless 256-query Perceiver resampler (the trainer8 recipe). The teacher target is the "
        "256 QueryFormer rows of cap_feats after the 6-layer text_projection; the adapter is "
        "text-only and pairs unchanged with the model's SigVQ vision encoder for editing. "
        "The teacher needs ~34 GB of combined GPU + CPU memory."
    ),
    adapter_kind="resampler",
    default_folder="llada_adapter",
    shard_contract="llada_image/2",
    teacher_repo="inclusionAI/LLaDA-Image-Turbo",
    defaults={},  # the built-in defaults are this recipe's
    export_kvs={
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "llada_image_turbo text_projection query rows",
        "adapter.teacher": "inclusionAI/LLaDA-Image-Turbo",
    },
    ggk_min_version="0.5.7",
    t2i_template=TEMPLATE,
    t2i_empty=EMPTY,
    max_len_student=512,
    materials=STUDENT_MATERIALS + (TEACHER, SIGVQ),
    metric_names=("cos_centered", "cos_rms", "worst_row_cos_rms", "rel_mse", "cos_raw", "roundtrip_cos",
                  "trained_steps", "val_batches"),
    judge=EvalGuide(
        headline="cos_centered", also=("rel_mse",),
        good="the reference run reached 0.965 / 0.0024; below ~0.9 widen (1536) or deepen the adapter; never judge "
             "by cos_raw, ~0.99 even for a zero prediction",
        references=(("cos_centered", "0.965"), ("rel_mse", "0.0024")),
        source="gguf-trainer 0.0.14's pack hint (the published package, PyPI): "
               "val centred cosine / rel_mse of the reference RTX 5090 run, "
               "20k steps (~55 min); training-val figures whose centred cosine is on standardized rows, while "
               "eval.json's cos_centered only subtracts the mean: close kin, not the same number"),
    teacher_control="placement",
    reference_dims={"out_dim": OUT_DIM, "num_queries": NUM_QUERIES},
    engine=EngineFacts(versions=("llada_image",)),
    extras=SigVQExtras(),
    ggk_model_args="--diffusion-model LLaDA-image-turbo-nvfp4.gguf --vae pig_flux2_vae_fp32-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf} --llm_vision {sigvq}",
    settings=(pack_setting("export.export_sigvq", True, boolean,
                           "also write the SigVQ vision file the engine's --llm_vision reads for this adapter"),),
    # LLaDA's mock rows are 1.3 MB a prompt, so its corpus is smaller; they are learnt slowly at the
    # recipe's 2e-4 in 200 steps
    demo_settings=("corpus.n_train=96", "corpus.n_val=32", "precompute.shard_size=48",
                   "precompute.val_shard_size=32", "precompute.mock_teacher=true", "train.lr=0.002"),
)
