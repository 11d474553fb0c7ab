"""PixArt: the 4.7B T5-XXL v1.1 encoder → pig_clip + a 120-query resampler seeded with T5 ids.

The worked example of docs/PACKS.md. Per prompt the teacher gives T5's last_hidden_state at
the real slots of the 120-slot PixArt window (the T5 pieces + EOS, padded with 0); the
student reads the raw prompt (no template); the adapter's query i is seeded with the T5
embedding of slot i, so the ids the engine already builds for its mask select the queries.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from trainer_core.packs.base import STUDENT_MATERIALS, Budgets, Material, TrainerPack

if TYPE_CHECKING:
    from trainer_core.contract.kinds import AdapterConfig
    from trainer_core.base.folder import ProjectFolder

# the reference shapes (T5-XXL v1.1); the stages read the real ones from the teacher's config
T5_WIDTH, T5_VOCAB = 4096, 32128
T5_WINDOW = 120  # PixArt's caption window = the seeded queries (t5_teacher.T5_WINDOW)

TEACHER = Material(
    "teacher", "T5-XXL v1.1 encoder (teacher)", "hf_snapshot", repo="callgg/t5-v1_1-xxl-encoder-bf16",
    patterns=("config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
              "spiece.model", "tokenizer_config.json"),
    subdir="t5-v1_1-xxl-encoder-bf16", size_hint="~9.5 GB",
    hint="a ~12 GiB GPU budget keeps it resident; smaller cards stream its layers from RAM")


@dataclass(frozen=True)
class PixArtPack(TrainerPack):

    def teacher_dims(self, project: "ProjectFolder") -> dict[str, int]:
        """d_model and vocab_size of the teacher's config.json (the reference shape when the
        teacher is mocked and not downloaded)."""
        from trainer_core.contract.shards import mock_enabled
        path = self.resolve_material(project, "teacher") / "config.json"
        if not path.is_file() and mock_enabled(project):
            return {"out_dim": T5_WIDTH, "seed_vocab": T5_VOCAB, "num_queries": T5_WINDOW}
        config = json.loads(self.require_material(project, "teacher").joinpath("config.json").read_text())
        return {"out_dim": int(config["d_model"]), "seed_vocab": int(config["vocab_size"]),
                "num_queries": T5_WINDOW}

    def build_teacher(self, project: "ProjectFolder", device: Any) -> Any:
        from trainer_core.packs.t5xxl_pixart.teacher import T5Teacher
        p = project.settings.precompute
        return T5Teacher(self.require_material(project, "teacher"), device=device, mode=p.teacher_mode,
                         gpu_mem_gib=p.gpu_mem_gib)

    def build_mock_teacher(self, project: "ProjectFolder") -> Any:
        from trainer_core.packs.t5xxl_pixart.teacher import MockT5Teacher
        dims = self.teacher_dims(project)
        return MockT5Teacher(dims["out_dim"], dims["seed_vocab"])

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.t5xxl_pixart.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device)
        student_batch = p.student_batch or auto["student_batch"]
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       student_batch, p.student_tok_budget or student_batch * self.max_len_student)

    def make_shard(self, prompts: list[str], student: Any, teacher: Any, budgets: Budgets, session: Any = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch

        from trainer_core.contract.batching import greedy_batches
        from trainer_core.contract.shards import target_moments
        windows, lens = teacher.seed_windows(prompts)                       # [S, 120], [S]
        lens_list = lens.tolist()
        order = sorted(range(len(prompts)), key=lens_list.__getitem__)     # stable: by seed length
        prompts = [prompts[i] for i in order]
        windows, lens = windows[order], lens[order]
        # each sample's real slots written straight into the packed rows (batches run in sample order):
        # a list of batch outputs and a cat would hold the rows twice
        t_pack: torch.Tensor | None = None                                  # [Σ seed_len, out] bf16
        at = 0
        for batch in greedy_batches(lens.tolist(), budgets.teacher_batch, budgets.tok_budget):
            out = teacher.forward(windows[batch], lens[batch]).to("cpu", torch.bfloat16)  # [b, L, out]
            if t_pack is None:
                t_pack = torch.empty(int(lens.sum()), out.shape[-1], dtype=torch.bfloat16)
            for j, i in enumerate(batch):
                n = int(lens[i])
                t_pack[at:at + n] = out[j, :n]
                at += n
        assert t_pack is not None and at == t_pack.shape[0]                 # a shard has at least one prompt
        tokens, q_rows, truncated = student.rows([student.ids(self.student_chunks(p)) for p in prompts],
                                                 self.max_len_student, budgets.student_batch,
                                                 budgets.student_tok_budget)
        tensors = {
            "ids": torch.tensor([t for ids in tokens for t in ids], dtype=torch.int32),
            "len": torch.tensor([len(ids) for ids in tokens], dtype=torch.int32),
            "q_pack": torch.cat(q_rows),                                     # [T, in] bf16
            "t_pack": t_pack,
            "t_len": lens.to(torch.int32),
            "seed_ids": windows.to(torch.int32),                             # [S, 120]
            "seed_len": lens.to(torch.int32),
            **target_moments(t_pack),
        }
        return tensors, {"prompts": prompts, "num_queries": int(windows.shape[1]),
                         "truncated_student": truncated}

    def adapter_config(self, project: "ProjectFolder", in_dim: int, dims: Mapping[str, int] | None = None
                       ) -> "AdapterConfig":
        from trainer_core.contract.kinds import AdapterConfig
        dims, t = dims or self.teacher_dims(project), project.settings.train
        return AdapterConfig("seeded_resampler", in_dim=in_dim, out_dim=dims["out_dim"], width=t.width,
                             depth=t.depth, num_queries=dims["num_queries"], seed_vocab=dims["seed_vocab"])

    def adapter_kvs(self, config: "AdapterConfig") -> dict[str, Any]:
        """adapter.t5_vocab is the trained seed table's size, not the reference one."""
        return {**self.export_kvs, "adapter.t5_vocab": config.seed_vocab}

    def build_demo_materials(self, project: "ProjectFolder", prompts: list[str]) -> None:
        """A tiny real T5 encoder, its sentencepiece model trained on the demo prompts."""
        from trainer_core.packs.t5xxl_pixart.tiny import write_tiny_t5
        write_tiny_t5(self.resolve_material(project, "teacher"), prompts)


PACK = PixArtPack(
    id="t5xxl_pixart",
    title="PixArt (T5-XXL v1.1 → 120-query seeded resampler)",
    description=(
        "Replaces PixArt's 4.7B T5-XXL v1.1 encoder (--t5xxl) with pig_clip and a 120-query "
        "resampler whose queries are seeded with the T5 sentencepiece embedding of their slot "
        "(the original trainer recipe). The T5 tokenizer stays at inference; the encoder is never "
        "loaded. Targets are T5's last_hidden_state at the real slots (~40 rows × 4096 a prompt)."
    ),
    adapter_kind="seeded_resampler",
    corpus_kind="text",
    default_folder="t5_adapter",
    shard_contract="t5xxl_pixart/1",
    teacher_repo="callgg/t5-v1_1-xxl-encoder-bf16",
    defaults={
        "corpus": {"n_train": 120000, "n_val": 2048, "empty_frac": 0.01},
        "precompute": {
            "shard_size": 1024, "val_shard_size": 512,
            "teacher_batch": 0, "tok_budget": 0, "student_batch": 0, "teacher_mode": "auto",
        },
        "train": {"depth": 6, "sigma_floor": 0.03},
        "export": {"export_sigvq": False},
    },
    export_kvs={
        "adapter.t5_vocab": T5_VOCAB,
        "adapter.qwen_hidden_source": "final_norm",
        "adapter.target": "t5_v1_1_xxl encoder last_hidden_state, 120-slot PixArt window",
        "adapter.teacher": "callgg/t5-v1_1-xxl-encoder-bf16",
    },
    max_len_student=256,
    reference_dims={"out_dim": T5_WIDTH, "num_queries": T5_WINDOW, "seed_vocab": T5_VOCAB},  # ~40 slots are real
    materials=STUDENT_MATERIALS + (TEACHER,),
    metric_names=("cos", "cos_rms", "rel_mse", "worst_row_cos", "cos_eos", "roundtrip_cos",
                  "trained_steps", "val_batches"),
    ggk_model_args="--diffusion-model pixart-nvfp4.gguf --vae pig_pixart_vae_fp16-f16.gguf",
    ggk_args="--llm {student} --llm-adapter {gguf}",
)
