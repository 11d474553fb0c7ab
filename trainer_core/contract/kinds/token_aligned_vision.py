"""Kind `token_aligned_vision` (MageFlow-Edit, Qwen-Image 2.1): position i of the student → position i of
the teacher, plus a skip path and the vision bridge (the frozen `vision_proj` the engine applies to every
mmproj embed before the student, and the trained `vis_in` that adds the raw rows at the image slots).

Trained on raw targets, MSE whitened by 1/σ_f over the supervised rows. The engine runs it when no other
runner's marker is there (no query, no slot bank, no layer_map). Its shards add the raw vision rows
(`v_pack` with `vis_sample` / `vis_start` / `vis_len` per image), `sup_start` (where the engine's slice
starts) and `t_sparse` (1: no teacher rows stored under the image slots; the reader scatters them back
and supervises the consumed text rows only, `meta.supervise` = consumed_text).
"""
from __future__ import annotations

from typing import Any, Mapping

from trainer_core.base.errors import UsageError
from trainer_core.contract.adapter_layout import TOKEN_BLOCK, Layout, LayoutProblem, check_expected, ne_reader
from trainer_core.contract.kinds._plain import plain_checks, plain_common, raw_loss, score_raw_rows
from trainer_core.contract.kinds.base import AdapterConfig, AdapterKind, KindField, Names, register

__all__ = ["KIND", "TokenAlignedVisionKind", "KV_VIS_DIM"]

KV_VIS_DIM = "adapter.vis_dim"


class TokenAlignedVisionKind(AdapterKind):
    name = "token_aligned_vision"
    title = "token-aligned"
    plural = "token-aligned adapters"
    detect_rank = 50            # the engine's default runner
    f32_names = frozenset({"vision_proj.weight"})
    infer_options = ("--vis",)
    fields = (KindField("vis_dim", 0, 0, "the raw mmproj width (vision_proj, vis_in); 0: no vision input"),
              KindField("has_vis_in", True, False, "vis_in: raw vision rows at the image slots (may be off)"),
              KindField("has_skip", True, False, "the skip path (may be off)"))
    shard_keys = ("v_pack", "vis_sample", "vis_start", "vis_len", "sup_start", "t_sparse")

    def canonical(self, c: AdapterConfig) -> dict[str, Any]:
        return {"has_vis_in": bool(c.vis_dim) and bool(c.has_vis_in)}

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        return True

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[LayoutProblem]
               ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        problems = plain_checks(names, problems)
        if any(p.fatal for p in problems):
            return None, problems
        common, problems = plain_common(names, problems)
        if common is None:
            return None, problems
        ne = ne_reader(names)
        vp, vi = ne("vision_proj.weight"), ne("vis_in.weight")
        if vp and vi and vp[0] != vi[0]:
            return None, problems + [LayoutProblem(
                f"adapter.vision_proj.weight ({vp[0]}) and adapter.vis_in.weight ({vi[0]}) disagree on "
                f"the vision width; the engine takes whichever it reads last")]
        if vi and not vp:
            problems.append(LayoutProblem("adapter.vis_in.weight without adapter.vision_proj.weight: the "
                                          "engine cannot run reference images through this adapter", fatal=False))
        try:
            config = AdapterConfig(kind=self.name, vis_dim=(vp or vi or (0,))[0], has_vis_in=vi is not None,
                                   has_skip=ne("skip.weight") is not None, **common)
        except ValueError as e:
            return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
        return check_expected(config, self.expected_ne(config), names, problems, self.f32_names)

    def expected_ne(self, c: AdapterConfig) -> dict[str, tuple[int, ...]]:
        W, layout = c.width, Layout(c.width)
        if c.vis_dim:
            layout.tensor("vision_proj.weight", c.vis_dim, c.in_dim)
        layout.linear("in_proj", c.in_dim, W)
        if c.vis_dim and c.has_vis_in:
            layout.tensor("vis_in.weight", c.vis_dim, W)
        layout.blocks(c.depth, TOKEN_BLOCK, c.mlp)
        layout.norm("ln_out")
        layout.linear("out_proj", W, c.out_dim)
        if c.has_skip:
            layout.linear("skip", c.in_dim, c.out_dim)
        return layout.ne

    def frozen_count(self, c: AdapterConfig) -> int:
        """vision_proj: fitted by precompute, applied as it is."""
        return c.vis_dim * c.in_dim

    def vision_width(self, c: AdapterConfig) -> int:
        return c.vis_dim

    def structural_kvs(self, c: AdapterConfig) -> tuple[list, list]:
        return ([(KV_VIS_DIM, c.vis_dim, "u32")] if c.vis_dim else []), []

    # ------------------------------------------------------------ torch
    def build(self, c: AdapterConfig) -> Any:
        from trainer_core.contract.adapter import TokenAligned
        return TokenAligned(c.in_dim, c.out_dim, c.width, c.depth, c.mlp, vis_dim=c.vis_dim,
                            vis_in=c.has_vis_in, skip=c.has_skip)

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        return raw_loss(batch, pred, sigma, cos_weight)

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        """val_cos over the supervised rows; split into vision / text rows ("vis" / "txt"), or, when only
        text rows are supervised (`by_sample`), samples with images / without ("edit" / "t2i")."""
        rows = score_raw_rows(score, batch, pred)
        if batch.vision is not None:
            edit = batch.vision.any(-1, keepdim=True)
            parts = ((("edit", batch.tmask & edit), ("t2i", batch.tmask & ~edit)) if score.by_sample else
                     (("vis", batch.tmask & batch.vision), ("txt", batch.tmask & ~batch.vision)))
            for name, where in parts:
                score.pool(name, rows, where.to(rows.dtype))

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        from trainer_core.contract.losses import TokenAlignedMetrics
        return TokenAlignedMetrics()

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        metrics.update(pred, batch.target, sup=batch.tmask, vision=batch.vision, sup_start=batch.sup_start,
                       keep=batch.mask, pred_ck=pred_ck)

    # ------------------------------------------------------------ the shard schema
    def rows(self, src: Any) -> None:
        from trainer_core.contract.batch import mmap_tensor
        src.sparse = int(src.shard["t_sparse"][0]) == 1          # no teacher rows under the slots
        src.consumed_only = src.shard.meta.get("supervise") == "consumed_text"
        src._v = mmap_tensor(src.shard.path, "v_pack")
        src.sup_start = src.shard["sup_start"].long()
        src.blocks = src.vision_blocks()

    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        import torch

        from trainer_core.contract.batch import Batch, gather
        rows = idx.tolist()
        lens, t_lens = src.len[idx], src.t_len[idx]
        L = int(lens.max())
        h, mask = gather(src._q, src.q_off[idx], lens, L, keep_dtype, pin)
        target, tmask = gather(src._t, src.t_off[idx], t_lens, int(t_lens.max()), keep_dtype, pin)
        dtype = src._v.dtype if keep_dtype else torch.float32
        vis = torch.zeros(len(rows), L, src._v.shape[1], dtype=dtype, pin_memory=pin)       # [B, L, vis]
        vision = torch.zeros(len(rows), L, dtype=torch.bool)
        for b, row in enumerate(rows):
            for start, n, off in src.blocks[row]:
                vis[b, start:start + n].copy_(src._v[off:off + n])
                vision[b, start:start + n] = True
        sup_start = src.sup_start[idx]
        if src.sparse:            # the stored rows are those off the slots, in order: scatter them back
            full = torch.zeros(len(rows), L, target.shape[2], dtype=target.dtype, pin_memory=pin)
            full[mask & ~vision] = target[tmask]
            target = full
        if src.consumed_only:     # the rows the DiT reads: from sup_start on, not under a slot
            tmask = mask & ~vision & (torch.arange(L)[None, :] >= sup_start[:, None])
        return Batch(h, mask, target, tmask, None, None, vis, vision, sup_start)

    # ------------------------------------------------------------ infer
    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        import torch
        kwargs = {}
        vis = given.get("--vis")
        if vis is not None:
            if not c.has_vis_in:
                raise UsageError("--vis is only for token-aligned adapters with a vision input (vis_in).")
            if vis.shape[0] != hidden.shape[0]:
                raise UsageError(f"--vis has {vis.shape[0]} rows but the student states have {hidden.shape[0]}; "
                                 f"the vision rows are dense: zeros outside the image slots.")
            kwargs["vis"] = torch.from_numpy(vis).unsqueeze(0)
        with torch.no_grad():
            out = model(torch.from_numpy(hidden).unsqueeze(0), None, **kwargs)       # [1, L, out]
        return out[0].numpy()


KIND = register(TokenAlignedVisionKind())
