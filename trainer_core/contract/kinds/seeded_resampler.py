"""Kind `seeded_resampler` (PixArt): the resampler with each query seeded by the embedding of its slot's
id (query_i + t5_embed[id_i]), so the ids the engine already builds for its mask select the queries.

Trained on raw targets, MSE whitened by 1/σ_f over the real slots (nothing to fold at export); the
engine runs it when the file has `adapter.query` and `adapter.t5_embed.weight`. Its shards add
`seed_ids` [S, window] and `seed_len` [S] (the real slots, EOS included) to the plain rows.
"""
from __future__ import annotations

from typing import Any, Mapping

from trainer_core.base.errors import UsageError
from trainer_core.contract.kinds._plain import raw_loss, score_raw_rows
from trainer_core.contract.kinds.base import AdapterConfig, KindField, Names, register
from trainer_core.contract.kinds.resampler import ResamplerKind

__all__ = ["KIND", "SeededResamplerKind"]


class SeededResamplerKind(ResamplerKind):
    name = "seeded_resampler"
    title = "seeded resampler"
    plural = "seeded resamplers"
    standardized = False
    detect_rank = 30
    infer_options = ("--t5-ids",)
    fields = (*ResamplerKind.fields,
              KindField("seed_vocab", 0, 0, "rows of the seed table (t5_embed): the T5 vocabulary"))
    shard_keys = ("seed_ids",)

    def validate(self, c: AdapterConfig) -> None:
        super().validate(c)
        if c.seed_vocab <= 0:
            raise ValueError("a seeded_resampler needs seed_vocab > 0")

    def claims(self, names: Names) -> bool:
        return "query" in names and "t5_embed.weight" in names

    def detected_seeds(self, ne: Any) -> dict[str, int]:
        seed = ne("t5_embed.weight")
        return {"seed_vocab": seed[1]} if seed and len(seed) == 2 else {}

    def seed_vocab(self, c: AdapterConfig) -> int:
        return c.seed_vocab

    def table_count(self, c: AdapterConfig) -> int:
        """t5_embed: one width-wide row read per query."""
        return c.seed_vocab * c.width

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        return raw_loss(batch, pred, sigma, cos_weight)

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        score_raw_rows(score, batch, pred)

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        from trainer_core.contract.losses import SeededMetrics
        return SeededMetrics()

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        metrics.update(pred, batch.target, batch.seed_len, pred_ck=pred_ck)

    # the shard schema: the plain rows, the window's ids and the real slots
    def rows(self, src: Any) -> None:
        src.seed_ids = src.shard["seed_ids"].long()

    def target_rows(self, src: Any, t_lens: Any) -> int:
        return src.seed_ids.shape[1]

    def seeds(self, src: Any, idx: Any, t_lens: Any) -> tuple[Any, Any]:
        return src.seed_ids[idx], t_lens

    def infer_inputs(self, c: AdapterConfig, given: Mapping[str, Any]) -> dict[str, Any]:
        import torch
        t5_ids = given.get("--t5-ids")
        if t5_ids is None:
            raise UsageError("This adapter is seeded with T5 token ids: pass them with --t5-ids "
                             "(the engine's t5_ids.txt or a .npy).")
        if len(t5_ids) != c.num_queries:
            raise UsageError(f"--t5-ids has {len(t5_ids)} ids but this adapter has {c.num_queries} query "
                             f"slots; the window is the T5 ids + EOS padded with 0 to {c.num_queries}.")
        if max(t5_ids) >= c.seed_vocab or min(t5_ids) < 0:
            raise UsageError(f"--t5-ids holds an id outside the adapter's seed table (0..{c.seed_vocab - 1}).")
        return {"seed_ids": torch.tensor([t5_ids])}


KIND = register(SeededResamplerKind())
