"""What an adapter kind is: its config (`AdapterConfig`) and the interface every kind module implements
(`AdapterKind`), with the registry they are entered in.

A kind is one network the engine runs (engine-contract §0.1–§4): how its config is validated, how the
engine tells it from its tensors and sizes it, its GGUF layout and KVs, its shard schema, its forward,
loss, validation score and evaluation, and what `infer` and `inspect` need. The code that uses an
adapter — the stages, export, evaluate, infer, inspect, the plan — asks the config's kind
(`get_kind(config.kind)`) and never branches on a kind's name.

This module is light (no torch): the GUI and the plan import it. The torch parts of a kind import
torch inside their methods. The kinds themselves are found by the package (`contract/kinds/__init__.py`):
every module there with a `KIND`, plus those a distribution declares in the `gguf_trainer.kinds`
entry-point group.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Mapping

__all__ = ["HEAD_DIM", "AdapterConfig", "AdapterKind", "Problem", "register", "get_kind", "registered"]

HEAD_DIM = 64                  # the engine's attention head width for every adapter kind

_REGISTRY: dict[str, "AdapterKind"] = {}


def register(kind: "AdapterKind") -> "AdapterKind":
    """Enter a kind under its name (a second kind with a taken name is refused)."""
    known = _REGISTRY.get(kind.name)
    if known is not None and type(known) is not type(kind):
        raise ValueError(f"two adapter kinds are named {kind.name!r}: {type(known).__name__} and {type(kind).__name__}")
    _REGISTRY[kind.name] = kind
    return kind


def registered() -> dict[str, "AdapterKind"]:
    return dict(_REGISTRY)


def get_kind(name: str) -> "AdapterKind":
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown adapter kind {name!r}; expected one of {tuple(_REGISTRY)}") from None


@dataclass(frozen=True)
class AdapterConfig:
    """One adapter's shape. Every kind uses a subset of the fields; its `canonical` form zeroes the rest,
    so two descriptions of the same network compare equal."""

    kind: str
    in_dim: int                 # student hidden size (1024 for pig_clip)
    out_dim: int                # teacher row width
    width: int = 1024
    depth: int = 6
    mlp_hidden: int = 0         # 0 = 4·width
    num_queries: int = 0        # query-bank kinds: the learned queries
    seed_vocab: int = 0         # seeded kinds: rows of the seed table
    vis_dim: int = 0            # vision kinds: raw mmproj width
    has_vis_in: bool = True     # raw-vision injection (the engine allows it off)
    has_skip: bool = True       # skip path (the engine allows it off)
    taps: tuple[int, ...] = ()  # layerwise: the teacher layers stacked, ascending (layer_map)
    max_slots: int = 0          # slot kinds: rows of slot_query (the longest template it takes)
    seed_rank: int = 0          # slot kinds: columns of the frozen seed table
    n_bank: int = 0             # slot kinds: rows of the fixed bank, 0 = none
    bank_dim: int = 0           # slot kinds: width of a bank row
    bank_align: bool = False    # slot kinds: bank_in adds the student's rows to the bank

    def __post_init__(self) -> None:
        kind = get_kind(self.kind)
        if self.width % HEAD_DIM or self.width <= 0:
            raise ValueError(f"adapter width must be a positive multiple of {HEAD_DIM}, got {self.width}")
        kind.validate(self)
        for key, value in {"mlp_hidden": self.mlp_hidden or 4 * self.width, **kind.canonical(self)}.items():
            object.__setattr__(self, key, value)

    @property
    def heads(self) -> int:
        return self.width // HEAD_DIM

    @property
    def mlp(self) -> int:
        return self.mlp_hidden

    @property
    def layer_dim(self) -> int:
        """The width of one tapped layer (layerwise); out_dim for the other kinds."""
        return self.out_dim // len(self.taps) if self.taps else self.out_dim

    @property
    def spec(self) -> "AdapterKind":
        """The kind that runs this config."""
        return get_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AdapterConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# what the config fields mean when a kind does not use them
NO_QUERIES: dict[str, Any] = {"num_queries": 0}
NO_SEEDS: dict[str, Any] = {"seed_vocab": 0}
NO_SLOTS: dict[str, Any] = {"max_slots": 0, "seed_rank": 0, "n_bank": 0, "bank_dim": 0, "bank_align": False}
NO_VISION: dict[str, Any] = {"vis_dim": 0, "has_vis_in": False}
NO_TAPS: dict[str, Any] = {"taps": ()}

Problem = Any          # adapter_layout.LayoutProblem (a kind's detect returns a list of them)
Names = Mapping[str, tuple[tuple[int, ...], str]]     # "query" → (ne, dtype name), the adapter.* tensors


class AdapterKind:
    """The interface of an adapter kind; a kind module subclasses it and sets `KIND = register(TheKind())`.

    Light parts (no torch): `validate`, `canonical`, `claims`, `detect`, `expected_ne`, `structural_kvs`,
    `check_export`, `parameter_count`, `describe`, `head_label`. Torch parts: `build`, `forward`, `loss`,
    `score_batch`, `eval_metrics`, `eval_batch`, `rows`/`collate` (the shard schema), `infer`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""                  # how messages name it: "for {title} adapters only"
    plural: ClassVar[str] = ""                 # and in "{option} is only for {plural}" ("seeded resamplers")
    standardized: ClassVar[bool] = False       # trained on (t − μ)/σ_f; the export folds μ, σ back in
    detect_rank: ClassVar[int] = 100           # the engine checks the kinds' marker tensors in this order
    f32_names: ClassVar[frozenset[str]] = frozenset()   # 2-D tensors the engine keeps F32 (its `_keep_f32`)
    top_level: ClassVar[tuple[str, ...]] = ()  # tensors outside `adapter.` the engine reads for this kind
    infer_options: ClassVar[tuple[str, ...]] = ()   # the `gguf-trainer infer` inputs this kind takes
    pooled_val: ClassVar[bool] = False         # val_cos is the mean of its pooled head splits (bridges)
    grad_checkpoint_auto: ClassVar[bool] = False   # train.grad_checkpoint auto turns it on on a GPU

    # ------------------------------------------------------------ the config
    def validate(self, c: AdapterConfig) -> None:
        """Raise ValueError naming what the config lacks for this kind."""

    def canonical(self, c: AdapterConfig) -> dict[str, Any]:
        """The fields this kind fixes (the ones it does not use, zeroed)."""
        return {}

    # ------------------------------------------------------------ the engine's file
    def claims(self, names: Names) -> bool:
        """Whether the engine runs a file with these adapter.* tensors with this kind's runner."""
        return False

    def detect(self, names: Names, outside: Names, layer_map: Any, problems: list[Problem]
               ) -> tuple[AdapterConfig | None, list[Problem]]:
        """The config the engine reads from the tensors (a file this kind claims), and what is wrong."""
        raise NotImplementedError

    def expected_ne(self, c: AdapterConfig) -> dict[str, tuple[int, ...]]:
        """Every adapter tensor (state_dict order) → its GGUF ne: the one description of the layout."""
        raise NotImplementedError

    def parameter_count(self, c: AdapterConfig) -> int:
        total = 0
        for ne in self.expected_ne(c).values():
            n = 1
            for d in ne:
                n *= d
            total += n
        return total

    def table_count(self, c: AdapterConfig) -> int:
        """Parameters read by index, not multiplied (a seed table): memory, but no FLOPs (the plan's estimate)."""
        return c.seed_vocab * (c.seed_rank or c.width)

    def frozen_count(self, c: AdapterConfig) -> int:
        """Parameters training does not update (a slot kind's fitted seed table): no gradient or optimizer state
        in memory or in a checkpoint (the plan's estimate)."""
        return c.seed_vocab * c.seed_rank

    def reads_top_level(self, name: str) -> bool:
        return any(name == t or (t.endswith(".") and name.startswith(t)) for t in self.top_level)

    def structural_kvs(self, c: AdapterConfig) -> tuple[list[tuple[str, Any, str]], list[tuple[str, Any, str]]]:
        """This kind's KVs (provenance; the engine reads none): those written right after adapter.out_dim,
        and those after adapter.heads, as (key, value, type)."""
        return [], []

    def check_export(self, c: AdapterConfig, path: Any, arrays: Mapping[str, list[str]],
                     extra: Mapping[str, Any]) -> None:
        """Refuse (ModelFileError) an export the engine could not use (a missing vocabulary)."""

    def array_kvs(self, c: AdapterConfig, arrays: Mapping[str, list[str]]) -> list[tuple[str, Any, str]]:
        """KVs written after the string arrays (the names of the vocabulary they hold)."""
        return []

    def bank_head(self, c: AdapterConfig) -> str | None:
        """The second head folded with its own statistics (mu_bank, sigma_bank), when the config has one."""
        return None

    def folded_heads(self, c: AdapterConfig) -> tuple[str, ...]:
        """The heads the export folds the statistics into (kept f32 in weights-only copies)."""
        return ("out_proj",)

    def describe(self, c: AdapterConfig, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """What `inspect` adds to the config of a file of this kind."""
        return {}

    def head_label(self, bank: bool) -> str | None:
        """Which rows `infer` returned, for kinds with two heads."""
        return None

    # ------------------------------------------------------------ torch: model, training, evaluation
    def build(self, c: AdapterConfig) -> Any:
        raise NotImplementedError

    def forward(self, c: AdapterConfig, model: Any, batch: Any) -> Any:
        """The adapter's output on a Batch, fed as the engine feeds this kind."""
        extra = ({"seed_ids": batch.seed_ids} if batch.seed_ids is not None else
                 {"vis": batch.vis} if batch.vis is not None else {})
        return model(batch.h, batch.mask, **extra)

    def loss(self, c: AdapterConfig, batch: Any, pred: Any, mu: Any, sigma: Any, cos_weight: float,
             bank_stats: Any = None) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def score_batch(self, score: Any, batch: Any, pred: Any) -> None:
        """Add one validation batch to `score` (objective.ValScore: cos, rel, split)."""
        raise NotImplementedError

    def eval_metrics(self, c: AdapterConfig, mu: Any, sigma: Any, bank: Any) -> Any:
        """The accumulator of eval.json's metrics (contract/losses.py and friends)."""
        raise NotImplementedError

    def teacher_scale(self, c: AdapterConfig, out: Any, mu: Any, sigma: Any, bank: Any) -> Any:
        """The trained network's output in teacher units (a checkpoint, before the export folds μ, σ in);
        `bank` is the bank head's (μ, σ) or None."""
        import torch
        return torch.addcmul(mu, out, sigma) if self.standardized else out

    def eval_batch(self, metrics: Any, batch: Any, pred: Any, pred_ck: Any) -> None:
        """One val batch into the metrics: `pred` the GGUF's rows, `pred_ck` the checkpoint's (teacher scale)."""
        raise NotImplementedError

    def extra_rows(self, c: AdapterConfig, batch: Any) -> int:
        """Rows a sample adds beyond its student and target rows (the micro-batch token budget)."""
        return 0

    def step_rows(self, c: AdapterConfig) -> int:
        """The fixed output rows of a training step's [B, R, D] tensors (query banks), 0 when they vary."""
        return 0

    # ------------------------------------------------------------ the shard schema
    def rows(self, src: Any) -> None:
        """Read this kind's shard keys into the shard reader `src` (contract/batch.ShardRows)."""

    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------ infer
    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        """The adapter on one student sequence, batch 1 and no mask, as the engine runs it: rows [R, out]."""
        raise NotImplementedError
