"""Kind `resampler` (LLaDA-Image): learned queries cross-attend to the student states, [B, NQ, out].

Trained on standardized targets (t − μ)/σ_f over every row (the export folds μ, σ into out_proj);
the engine runs it when the file has `adapter.query` (without a seed table). Its shards hold the
plain rows: the student's and the teacher's, packed per sample.
"""
from __future__ import annotations

from typing import Any, Mapping

from trainer_core.contract.adapter_layout import (RESAMPLER_BLOCK, Layout, LayoutProblem, check_expected,
                                                  ne_reader)
from trainer_core.contract.kinds._plain import plain_checks, plain_common, standardized_loss
from trainer_core.contract.kinds.base import AdapterConfig, AdapterKind, KindField, Names, register

__all__ = ["KIND", "ResamplerKind", "KV_NUM_QUERIES"]

KV_NUM_QUERIES = "adapter.num_queries"


class ResamplerKind(AdapterKind):
    name = "resampler"
    title = "resampler"
    plural = "resamplers"
    standardized = True
    detect_rank = 31
    f32_names = frozenset({"query"})
    fields = (KindField("num_queries", 0, 0, "the learned queries: the rows it returns"),)

    def validate(self, c: AdapterConfig) -> None:
        if c.num_queries <= 0:
            raise ValueError(f"a {c.kind} needs num_queries > 0")

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        return "query" in names

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[LayoutProblem]
               ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        problems = plain_checks(names, problems)
        if any(p.fatal for p in problems):
            return None, problems
        common, problems = plain_common(names, problems)
        if common is None:
            return None, problems
        ne = ne_reader(names)
        query = ne("query")
        try:
            config = AdapterConfig(kind=self.name, num_queries=query[1] if len(query) == 2 else 0,
                                   **self.detected_seeds(ne), **common)
        except ValueError as e:
            return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
        return check_expected(config, self.expected_ne(config), names, problems, self.f32_names)

    def detected_seeds(self, ne: Any) -> dict[str, int]:
        """The seed fields the engine reads from the tensors (none: the resampler has no seed table)."""
        return {}

    def expected_ne(self, c: AdapterConfig) -> dict[str, tuple[int, ...]]:
        W, layout = c.width, Layout(c.width)
        layout.tensor("query", W, c.num_queries)
        if self.seed_vocab(c):
            layout.tensor("t5_embed.weight", W, self.seed_vocab(c))
        layout.linear("in_proj", c.in_dim, W)
        layout.blocks(c.depth, RESAMPLER_BLOCK, c.mlp)
        layout.norm("ln_out")
        layout.linear("out_proj", W, c.out_dim)
        return layout.ne

    def structural_kvs(self, c: AdapterConfig) -> tuple[list, list]:
        return [], [(KV_NUM_QUERIES, c.num_queries, "u32")]

    def seed_vocab(self, c: AdapterConfig) -> int:
        """Rows of the seed table (t5_embed), 0 for the plain resampler."""
        return 0

    # ------------------------------------------------------------ torch
    def build(self, c: AdapterConfig) -> Any:
        from trainer_core.contract.adapter import Resampler
        return Resampler(c.in_dim, c.out_dim, c.width, c.depth, c.mlp, c.num_queries, self.seed_vocab(c))

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        return standardized_loss(batch, pred, mu, sigma, cos_weight)

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        from trainer_core.contract.losses import rel_mse, row_cos, standardize
        score.cos += float(row_cos(pred, standardize(batch.target, score.mu, score.sigma)).mean())
        score.rel += float(rel_mse(pred * score.sigma + score.mu, batch.target))

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        from trainer_core.contract.losses import ResamplerMetrics
        return ResamplerMetrics(mu)

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        metrics.update(pred, batch.target, pred_ck=pred_ck)

    def step_rows(self, c: AdapterConfig) -> int:
        return c.num_queries

    # ------------------------------------------------------------ the shard schema: plain packed rows
    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        from trainer_core.contract.batch import Batch, gather
        lens, t_lens = src.len[idx], src.t_len[idx]
        h, mask = gather(src._q, src.q_off[idx], lens, int(lens.max()), keep_dtype, pin)
        target, tmask = gather(src._t, src.t_off[idx], t_lens, self.target_rows(src, t_lens), keep_dtype, pin)
        return Batch(h, mask, target, tmask, *self.seeds(src, idx, t_lens))

    def target_rows(self, src: Any, t_lens: Any) -> int:
        return int(t_lens.max())

    def seeds(self, src: Any, idx: Any, t_lens: Any) -> tuple[Any, Any]:
        return None, None

    # ------------------------------------------------------------ infer
    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        import torch
        with torch.no_grad():
            out = model(torch.from_numpy(hidden).unsqueeze(0), None, **self.infer_inputs(c, given))  # [1, R, out]
        return out[0].numpy()

    def infer_inputs(self, c: AdapterConfig, given: Mapping[str, Any]) -> dict[str, Any]:
        return {}


KIND = register(ResamplerKind())
