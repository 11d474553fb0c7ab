"""Kind `qwen35_bridge` (MOSS-Image; FLUX.3 Klein's prompt upsampler): [fixed bank ; one seeded slot per
teacher template token] read the student through resampler blocks, with two heads (contract/adapter.Bridge).

Slot i's query is slot_query[i] + seed_proj(seed_embed[id_i]) + vis_q(raw vision row under it); the raw
vision rows are extra keys (vis_in). With a bank (`n_bank` rows), it is prompt-aligned exactly when
`bank_in` exists (the student's rows added to bank rows 3 + i, on FLUX.3 only). The engine runs this
runner for `adapter.slot_query` without `adapter.cap_query`, reads every size from shapes (Part F 2, 5)
and tokenizes the MOSS template with the Qwen3.5 vocabulary inside the file, so an export without it is
refused. Slot and bank heads are standardized by their own moments and folded separately. The shards
(contract/bridge.py's docstring) hold the slots' ids and targets, the raw vision rows, which samples have
a bank target (`has_bank_target`; a shard of an earlier version names it `klein`) and their bank rows.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.adapter_layout import (RESAMPLER_BLOCK, Layout, LayoutProblem, check_expected, depth_of,
                                                  ne_reader)
from trainer_core.contract.kinds.base import AdapterConfig, AdapterKind, KindField, Names, register

__all__ = ["KIND", "Qwen35BridgeKind", "KV_KIND", "KV_N_BANK", "KV_BANK_DIM", "KV_BANK_ALIGN", "KV_MAX_SLOTS",
           "KV_SEED_RANK", "KV_SEED_VOCAB", "KV_VIS_DIM", "KV_TOKENS", "KV_MERGES", "BANK_TARGET", "OLD_BANK_TARGET"]

KV_KIND, KV_VIS_DIM = "adapter.kind", "adapter.vis_dim"
KV_N_BANK, KV_BANK_DIM, KV_BANK_ALIGN = "adapter.n_bank", "adapter.bank_dim", "adapter.bank_align"
KV_MAX_SLOTS, KV_SEED_RANK, KV_SEED_VOCAB = "adapter.max_slots", "adapter.seed_rank", "adapter.seed_vocab"
# the vocabulary the engine reads from a bridge adapter (packs-contract-more D.2 §5)
KV_TOKENS, KV_MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.merges"
# then the model and pre-tokenizer names the engine checks before it uses them
KV_TOKENIZER_MODEL, KV_TOKENIZER_PRE = "tokenizer.ggml.model", "tokenizer.ggml.pre"
TOKENIZER_MODEL, TOKENIZER_PRE = "gpt2", "qwen35"
# the shard key flagging the samples with a bank target, and its name in shards of an earlier version
BANK_TARGET, OLD_BANK_TARGET = "has_bank_target", "klein"


class Qwen35BridgeKind(AdapterKind):
    name = "qwen35_bridge"
    title = "Qwen3.5 bridge"
    plural = "Qwen3.5 bridge adapters"
    standardized = True
    detect_rank = 20
    f32_names = frozenset({"slot_query", "bank_query"})
    infer_options = ("--seed-ids", "--vis", "--vis-pos", "--bank")
    pooled_val = True
    grad_checkpoint_auto = True     # a bank and up to 2304 slots over 4096-d keys: activations dominate
    bank_names = ("bank_query", "out_bank")        # the fixed bank's query tensor and its head
    heads = ("moss", "klein")                       # the slot head's and the bank head's names in the metrics
    template = "Qwen3.5 ids of the MOSS template"
    fields = (KindField("seed_vocab", 0, 0, "rows of the frozen seed table (seed_embed): the teacher's vocabulary"),
              KindField("vis_dim", 0, 0, "the raw vision rows' width (vis_q, vis_in)"),
              KindField("has_vis_in", True, False, "raw vision rows as keys (vis_in; always there)"),
              KindField("max_slots", 0, 0, "rows of slot_query: the longest template it takes"),
              KindField("seed_rank", 0, 0, "columns of the frozen seed table"),
              KindField("n_bank", 0, 0, "rows of the fixed bank, 0 = none"),
              KindField("bank_dim", 0, 0, "width of a bank row"),
              KindField("bank_align", False, False, "bank_in adds the student's rows to the bank"))
    shard_keys = ("slot_ids", "v_pack", "vis_sample", "vis_start", "vis_len")
    optional_shard_keys = (BANK_TARGET, "bank_slots", "b_pack", "bank_rows", "bank_real", "bank_body")

    def validate(self, c: AdapterConfig) -> None:
        for name in ("max_slots", "seed_vocab", "seed_rank", "vis_dim"):
            if getattr(c, name) <= 0:
                raise ValueError(f"a {c.kind} adapter needs {name} > 0")
        if c.n_bank and c.bank_dim <= 0:
            raise ValueError(f"a {c.kind} adapter with a bank needs bank_dim > 0")

    def canonical(self, c: AdapterConfig) -> dict[str, Any]:
        # every slot seeded and fed raw vision
        canon: dict[str, Any] = {"has_vis_in": True, "bank_align": bool(c.bank_align) and self.aligned_bank}
        if not c.n_bank:
            canon.update(n_bank=0, bank_dim=0, bank_align=False)
        return canon

    def table_count(self, c: AdapterConfig) -> int:
        """seed_embed: one seed_rank-wide row read per slot."""
        return c.seed_vocab * c.seed_rank

    def frozen_count(self, c: AdapterConfig) -> int:
        """seed_embed: the PCA precompute fits, never trained."""
        return c.seed_vocab * c.seed_rank

    def vision_width(self, c: AdapterConfig) -> int:
        return c.vis_dim

    aligned_bank = True      # whether the bank can be prompt-aligned (bank_in)

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        return "slot_query" in names

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[LayoutProblem]
               ) -> tuple[AdapterConfig | None, list[LayoutProblem]]:
        """The engine's Qwen3.5 runner (Part F 2, 5): width and max_slots from slot_query, the seed table
        from seed_embed, vis_dim from vis_in (vis_q must agree), a bank only when both bank_query and
        out_bank exist, prompt-aligned exactly when bank_in exists (no KV is read)."""
        ne = ne_reader(names)
        for required in ("slot_query", "in_proj.weight", "out_proj.weight", "blocks.0.mlp.0.weight",
                         "seed_embed.weight", "vis_in.weight"):
            if ne(required) is None or len(ne(required)) != 2:
                return None, problems + [LayoutProblem(f"adapter.{required} (2-D) is missing; the engine cannot "
                                                       f"size the Qwen3.5 bridge without it")]
        width, max_slots = ne("slot_query")
        if width % 64:
            return None, problems + [LayoutProblem(f"adapter.slot_query gives width {width}, which is not a "
                                                   f"multiple of the engine's head_dim 64")]
        vis_dim, vis_q = ne("vis_in.weight")[0], ne("vis_q.weight")
        if vis_q is not None and vis_q[0] != vis_dim:
            return None, problems + [LayoutProblem(f"adapter.vis_q.weight reads {vis_q[0]}-wide vision embeds but "
                                                   f"adapter.vis_in.weight {vis_dim}-wide; the engine refuses to "
                                                   f"load the file")]
        bank_parts = ("bank_query", "out_bank.weight")
        has_bank = all(n in names for n in bank_parts)
        ignored: set[str] = set()
        if not has_bank:
            lone = [n for n in (*bank_parts, "out_bank.bias", "bank_in.weight") if n in names]
            if lone:
                ignored.update(lone)
                absent = " and ".join(f"adapter.{n}" for n in bank_parts if n not in names)
                problems.append(LayoutProblem(f"adapter.{lone[0]} without {absent}: the engine ignores "
                                              f"{'it' if len(lone) == 1 else 'them'} and runs no bank (FLUX.3 "
                                              f"refuses the file); gguf-trainer writes the bank tensors together",
                                              fatal=False))
        elif len(ne("bank_query")) != 2 or len(ne("out_bank.weight")) != 2:
            return None, problems + [LayoutProblem("adapter.bank_query and adapter.out_bank.weight must be 2-D; the "
                                                   "engine cannot size the bank")]
        try:
            config = AdapterConfig(
                kind=self.name, in_dim=ne("in_proj.weight")[0], out_dim=ne("out_proj.weight")[1], width=width,
                depth=depth_of(names), mlp_hidden=ne("blocks.0.mlp.0.weight")[1],
                seed_vocab=ne("seed_embed.weight")[1], seed_rank=ne("seed_embed.weight")[0], vis_dim=vis_dim,
                max_slots=max_slots, n_bank=ne("bank_query")[1] if has_bank else 0,
                bank_dim=ne("out_bank.weight")[1] if has_bank else 0,
                bank_align=has_bank and "bank_in.weight" in names)
        except ValueError as e:
            return None, problems + [LayoutProblem(f"the tensors do not make an adapter: {e}")]
        return check_expected(config, self.expected_ne(config), names, problems, self.f32_names, ignored)

    def expected_ne(self, c: AdapterConfig) -> dict[str, tuple[int, ...]]:
        W, layout = c.width, Layout(c.width)
        bank_query, bank_head = self.bank_names
        if c.n_bank:
            layout.tensor(bank_query, W, c.n_bank)
        layout.tensor("slot_query", W, c.max_slots)
        if c.n_bank and c.bank_align:
            layout.linear("bank_in", c.in_dim, W, bias=False)
        layout.tensor("seed_embed.weight", c.seed_rank, c.seed_vocab)
        layout.linear("seed_proj", c.seed_rank, W, bias=False)
        layout.linear("vis_q", c.vis_dim, W, bias=False)
        layout.linear("in_proj", c.in_dim, W)
        layout.linear("vis_in", c.vis_dim, W, bias=False)
        layout.blocks(c.depth, RESAMPLER_BLOCK, c.mlp)
        layout.norm("ln_out")
        if c.n_bank:
            layout.linear(bank_head, W, c.bank_dim)
        layout.linear("out_proj", W, c.out_dim)
        return layout.ne

    def structural_kvs(self, c: AdapterConfig) -> tuple[list, list]:
        return [], [(KV_KIND, c.kind, "str"), (KV_N_BANK, c.n_bank, "u32"), (KV_BANK_DIM, c.bank_dim, "u32"),
                    (KV_BANK_ALIGN, int(c.bank_align), "u32"), *self.slot_kvs(c)]

    def slot_kvs(self, c: AdapterConfig) -> list[tuple[str, Any, str]]:
        return [(KV_MAX_SLOTS, c.max_slots, "u32"), (KV_SEED_RANK, c.seed_rank, "u32"),
                (KV_SEED_VOCAB, c.seed_vocab, "u32"), (KV_VIS_DIM, c.vis_dim, "u32")]

    def check_export(self, c: AdapterConfig, path: Any, arrays: Mapping[str, list[str]],
                     extra: Mapping[str, Any]) -> None:
        if not (arrays.get(KV_TOKENS) and arrays.get(KV_MERGES)):
            raise ModelFileError(f"{path} was not written: the engine cannot tokenize the MOSS template without "
                                 f"the teacher's vocabulary ({KV_TOKENS} and {KV_MERGES}), so download the "
                                 f"teacher's tokenizer.json and export again.")

    def array_kvs(self, c: AdapterConfig, arrays: Mapping[str, list[str]]) -> list[tuple[str, Any, str]]:
        if not arrays.get(KV_TOKENS):
            return []
        return [(KV_TOKENIZER_MODEL, TOKENIZER_MODEL, "str"), (KV_TOKENIZER_PRE, TOKENIZER_PRE, "str")]

    def bank_head(self, c: AdapterConfig) -> str | None:
        return self.bank_names[1] if c.n_bank else None

    def folded_heads(self, c: AdapterConfig) -> tuple[str, ...]:
        return ("out_proj", self.bank_names[1])

    def head_label(self, bank: bool) -> str | None:
        return "bank" if bank else "slots"

    # ------------------------------------------------------------ torch
    def build(self, c: AdapterConfig) -> Any:
        from trainer_core.contract.adapter import Bridge
        return Bridge(c.in_dim, c.out_dim, c.width, c.depth, c.mlp, max_slots=c.max_slots, seed_vocab=c.seed_vocab,
                      seed_rank=c.seed_rank, vis_dim=c.vis_dim, n_bank=c.n_bank, bank_dim=c.bank_dim,
                      bank_align=c.bank_align, bank_names=self.bank_names)

    def forward(self, c: AdapterConfig, model: Any, batch: Any) -> Any:
        from trainer_core.contract.bridge import bridge_forward
        return bridge_forward(model, batch)

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        from trainer_core.contract.bridge import bridge_loss
        return bridge_loss(batch, pred, mu, sigma, bank_stats, cos_weight)

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        """The slot head's cosine over the real slots and the bank head's over its rows, pooled over the set
        (bank rows exist in some batches only); val_cos is their mean."""
        from trainer_core.contract.losses import rel_mse, row_cos, standardize
        slots, _, bank = pred
        slot_head, bank_head = self.heads
        cos = row_cos(slots, standardize(batch.target, score.mu, score.sigma))
        score.pool(slot_head, cos, batch.tmask.to(cos.dtype))
        score.rel += float(rel_mse(slots * score.sigma + score.mu, batch.target, batch.tmask))
        if bank is not None and score.bank_stats is not None and bank.shape[0]:
            bmu, bsigma = score.bank_stats
            b = batch.bridge
            bank_cos = row_cos(bank, standardize(b.bank_target, bmu, bsigma))
            score.pool(bank_head, bank_cos, b.bank_mask.to(bank_cos.dtype))

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        from trainer_core.contract.bridge import BridgeMetrics
        return BridgeMetrics(mu, None if bank is None else bank[0], self.heads)

    def teacher_scale(self, c: AdapterConfig, out: Any, mu: Any, sigma: Any, bank: Any) -> Any:
        slots, plain, aligned = out
        scale = (lambda x: None if x is None else x * bank[1] + bank[0]) if bank else (lambda x: None)  # noqa: E731
        return slots * sigma + mu, scale(plain), scale(aligned)

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        metrics.update(batch, pred, pred_ck)

    def extra_rows(self, c: AdapterConfig, batch: Any) -> int:
        # the raw vision keys, and the bank rows (a Klein sample's twice)
        return batch.bridge.vis_kv.shape[1] + (1 + c.bank_align) * c.n_bank

    # ------------------------------------------------------------ the shard schema
    def rows(self, src: Any) -> None:
        import torch

        from trainer_core.contract.batch import mmap_tensor
        path, keys = src.shard.path, src.shard.keys
        src.slot_ids = src.shard["slot_ids"].long()
        src._v = mmap_tensor(path, "v_pack")
        src.blocks = src.vision_blocks()
        # which samples have a bank target: the Klein samples (qwen35_bridge); every sample without the key (Ming)
        flag = next((k for k in (BANK_TARGET, OLD_BANK_TARGET) if k in keys), None)
        src.has_bank_target = (src.shard[flag].long() if flag is not None else
                               torch.ones(len(src.len), dtype=torch.long))
        src.n_bank = int(src.shard["bank_slots"][0]) if "bank_slots" in keys else 0
        src.aligned = "bank_body" in keys          # the bank rows carry the student's rows (the Klein bank)
        if src.n_bank:
            src.require("b_pack", "bank_rows", "bank_real")
            src._b = mmap_tensor(path, "b_pack")
            rows = src.shard["bank_rows"].long()
            src.b_off = torch.cumsum(rows, 0) - rows
            src.bank_real = src.shard["bank_real"].long()
            src.bank_body = src.shard["bank_body"].long() if src.aligned else None

    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        """The samples `idx` as a Batch with `bridge` parts (contract/bridge.py): the slots' ids and targets,
        the raw vision rows under their slots and as keys, and for the samples with a bank target their bank
        rows — a Klein sample's n80 rows (the stored pad row repeated) and bank_hidden (row 3 + i = the
        student's row i); a Ming sample's n_cap caption rows, no bank_hidden."""
        import torch

        from trainer_core.contract.batch import Batch, gather
        from trainer_core.contract.bridge import BANK_PREFIX, BridgeParts, bank_length
        lens, slots = src.len[idx], src.t_len[idx]
        B, P = len(idx), int(slots.max())
        h, mask = gather(src._q, src.q_off[idx], lens, int(lens.max()), keep_dtype, pin)
        target, tmask = gather(src._t, src.t_off[idx], slots, P, keep_dtype, pin)
        seed_ids = torch.zeros(B, P, dtype=torch.long)
        vdtype = src._v.dtype if keep_dtype else torch.float32
        n_vis = [sum(n for _, n, _ in src.blocks[i]) for i in idx.tolist()]
        V = max(n_vis, default=0)
        vis_slot = torch.zeros(B, P, src._v.shape[1], dtype=vdtype, pin_memory=pin)
        vis_kv = torch.zeros(B, V, src._v.shape[1], dtype=vdtype, pin_memory=pin)
        vis_keep = torch.arange(V)[None, :] < torch.tensor(n_vis, dtype=torch.long)[:, None]
        for b, i in enumerate(idx.tolist()):
            o, n = int(src.t_off[i]), int(src.t_len[i])
            seed_ids[b, :n] = src.slot_ids[o:o + n]
            at = 0
            for start, count, off in src.blocks[i]:
                rows = src._v[off:off + count].to(vdtype)
                vis_slot[b, start:start + count] = rows
                vis_kv[b, at:at + count] = rows
                at += count
        has_target = src.has_bank_target[idx].bool()
        parts = BridgeParts(vis_slot, vis_kv, vis_keep, has_target)
        if src.n_bank and bool(has_target.any()):
            members = idx[has_target].tolist()
            rows_of = [b for b in range(B) if bool(has_target[b])]
            K, NB = len(members), src.n_bank
            bdtype = src._b.dtype if keep_dtype else torch.float32
            bank_target = torch.zeros(K, NB, src._b.shape[1], dtype=bdtype, pin_memory=pin)
            bank_hidden = torch.zeros(K, NB, h.shape[2], dtype=h.dtype, pin_memory=pin) if src.aligned else None
            bank_mask = torch.zeros(K, NB, dtype=torch.bool)
            for k, (i, b) in enumerate(zip(members, rows_of)):
                off, real = int(src.b_off[i]), int(src.bank_real[i])
                n80 = bank_length(real, NB) if src.aligned else real
                bank_target[k, :real] = src._b[off:off + real].to(bdtype)
                if n80 > real:                                   # the one stored pad row, repeated
                    bank_target[k, real:n80] = src._b[off + real].to(bdtype)
                bank_mask[k, :n80] = True
                if bank_hidden is not None:
                    body = int(src.bank_body[i])
                    bank_hidden[k, BANK_PREFIX:BANK_PREFIX + body] = h[b, :body]
            parts.bank_hidden, parts.bank_target, parts.bank_mask = bank_hidden, bank_target, bank_mask
        return Batch(h, mask, target, tmask, seed_ids, slots, bridge=parts)

    # ------------------------------------------------------------ infer
    too_long = "a longer template needs smaller references (the engine's vlm_max_size=512)"

    def inputs(self, c: AdapterConfig, hidden: np.ndarray, given: Mapping[str, Any]) -> dict[str, Any]:
        """The Bridge's keyword inputs for one sample, batch 1, as the engine builds them: seed_ids [1, P];
        vis_slot [1, P, vis] (reference k's rows under slots S_k … S_k + N_k − 1, zeros elsewhere) and vis_kv
        [1, V, vis] (every row, in image order)."""
        import torch
        seed_ids, vis, vis_pos = given.get("--seed-ids"), given.get("--vis"), given.get("--vis-pos")
        if seed_ids is None:
            raise UsageError(f"This adapter seeds one slot per template token: pass the {self.template} with "
                             "--seed-ids (seed_ids.txt, one id a line, or a .npy).")
        P = len(seed_ids)
        if not 1 <= P <= c.max_slots:
            raise UsageError(f"--seed-ids has {P} ids but this adapter takes 1 to {c.max_slots}; {self.too_long}.")
        if min(seed_ids) < 0 or max(seed_ids) >= c.seed_vocab:
            bad = next(i for i in seed_ids if not 0 <= i < c.seed_vocab)
            raise UsageError(f"--seed-ids holds the id {bad}, outside the adapter's seed table "
                             f"(0..{c.seed_vocab - 1}).")
        if (vis is None) != (vis_pos is None):
            raise UsageError("--vis and --vis-pos go together: the raw vision rows of every reference, and the slot "
                             "start and count of each reference's run (S:N,…).")
        out = {"seed_ids": torch.tensor([seed_ids])}
        self.check_runs(vis_pos)
        if vis is not None and vis_pos is not None:
            if sum(n for _, n in vis_pos) != vis.shape[0]:
                raise UsageError(f"--vis-pos places {sum(n for _, n in vis_pos)} vision rows but --vis holds "
                                 f"{vis.shape[0]}; the counts must add up to the rows of --vis.")
            vis_slot = np.zeros((P, vis.shape[1]), np.float32)
            row, end = 0, 0
            for k, (start, count) in enumerate(vis_pos, 1):
                if start < 0 or count < 1 or start + count > P:
                    raise UsageError(f"--vis-pos run {k} ({start}:{count}) is not inside the {P} template slots "
                                     f"of --seed-ids; each run needs 0 ≤ START and START + COUNT ≤ {P}, COUNT ≥ 1.")
                if start < end:
                    raise UsageError(f"--vis-pos run {k} ({start}:{count}) starts before run {k - 1} ends (slot "
                                     f"{end}); the runs come in image order and do not overlap.")
                vis_slot[start:start + count] = vis[row:row + count]
                row, end = row + count, start + count
            out.update(vis_slot=torch.from_numpy(vis_slot)[None], vis_kv=torch.from_numpy(vis)[None])
        return out

    def check_runs(self, vis_pos: Any) -> None:
        """Refuse reference runs the engine would not take (Ming: one input image)."""

    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        """The slot rows [P, out_dim] MOSS-Image receives (the bank runs without the student's rows), or with
        --bank the Klein bank rows the engine hands FLUX.3: all n_bank of an unaligned bank, the first
        min(n_bank, ceil80(3 + L + 5)) of a prompt-aligned one (L = the student's rows, the raw prompt's
        tokens, at most n_bank − 8; 0 for the empty prompt, `empty_prompt` in `given`), bank_hidden row 3 + i =
        student row i."""
        import torch

        from trainer_core.contract.bridge import BANK_PREFIX, BANK_SUFFIX, bank_length
        bank = bool(given.get("--bank"))
        kwargs = self.inputs(c, hidden, given)
        if bank and not c.n_bank:
            raise UsageError("--bank reads the FLUX.3 Klein bank, and this adapter has none (FLUX.3 refuses it).")
        # the engine's body: the student's rows up to the bank's room, none for the empty prompt
        body = 0 if given.get("empty_prompt") else min(hidden.shape[0], max(0, c.n_bank - BANK_PREFIX - BANK_SUFFIX))
        if bank and c.bank_align:
            bank_hidden = np.zeros((c.n_bank, hidden.shape[1]), np.float32)
            bank_hidden[BANK_PREFIX:BANK_PREFIX + body] = hidden[:body]
            kwargs["bank_hidden"] = torch.from_numpy(bank_hidden)[None]
        with torch.no_grad():
            bank_rows, slot_rows = model(torch.from_numpy(hidden).unsqueeze(0), None, **kwargs)
        if not bank:
            return slot_rows[0].numpy()
        keep = bank_length(BANK_PREFIX + body + BANK_SUFFIX, c.n_bank) if c.bank_align else c.n_bank
        return bank_rows[0, :keep].numpy()


KIND = register(Qwen35BridgeKind())
