"""What an adapter kind is: its config (`AdapterConfig`), the fields a kind declares (`KindField`) and the
interface every kind module implements (`AdapterKind`), with the registry they are entered in.

A kind is one network the engine runs (engine-contract §0.1–§4): its config fields and how they are
validated, how the engine tells it from its tensors and sizes it, its GGUF layout and KVs, its shard schema
(`shard_keys`), its forward, loss, validation score and evaluation, and what `infer` and `inspect` need. The
code that uses an adapter — the stages, export, evaluate, infer, inspect, the plan — asks the config's kind
(`config.spec`) and never branches on a kind's name nor reads a field another kind may lack.

The config. `AdapterConfig` holds what every kind has (kind, in_dim, out_dim, width, depth, mlp_hidden) and
the values of its kind's own fields, which the kind module declares (`AdapterKind.fields`, a subclass kind
inherits its parent's and adds its own), so a new kind with a new field edits nothing here:

* `AdapterConfig(kind, in_dim=…, out_dim=…, width=…, depth=…, num_queries=…)`: a field the caller leaves
  out takes its declared default; a keyword the kind does not declare is refused (ValueError naming the
  field and the kind), except the neutral value of a field another registered kind declares, which is
  dropped (records of the previous version hold every field, zeroed where unused).
* Attribute access is strict: `config.num_queries` is the value of a kind's own field; reading a field the
  kind does not have raises AttributeError naming the kinds that do (so `getattr(config, name, default)`
  and `hasattr` still answer). Code outside a kind asks the kind instead (`table_count`, `tap_count`,
  `vision_width`, `step_rows`, …).
* Records (`to_dict`, written into checkpoints and eval.json) hold the common fields plus every field any
  registered kind declares: the config's value where its kind owns the field, that field's neutral value
  where it does not. For the built-in kinds that is the union of fields records always had, with the values
  they always had (eval.json stays byte-stable); a kind that brings a new field adds its neutral value to
  every record. Two kinds declaring a field of one name must agree on its neutral value (`register`).
  `from_dict` reads such a record, and those of the previous version, back into the same config.

This module is light (no torch): the GUI and the plan import it. The torch parts of a kind import
torch inside their methods. The kinds themselves are found by the package (`contract/kinds/__init__.py`):
every module there with a `KIND`, plus those a distribution declares in the `gguf_trainer.kinds`
entry-point group.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

__all__ = ["HEAD_DIM", "COMMON_FIELDS", "KindField", "AdapterConfig", "AdapterKind", "Problem", "register",
           "get_kind", "registered"]

HEAD_DIM = 64                  # the engine's attention head width for every adapter kind
COMMON_FIELDS = ("kind", "in_dim", "out_dim", "width", "depth", "mlp_hidden")     # what every kind has

_REGISTRY: dict[str, "AdapterKind"] = {}


@dataclass(frozen=True)
class KindField:
    """One config field of an adapter kind, declared by the kind module (`AdapterKind.fields`)."""

    name: str
    default: Any               # what a config gets when the caller gives no value
    neutral: Any               # what a record holds when the config's kind does not have the field
    meaning: str               # one line: what it is


def register(kind: "AdapterKind") -> "AdapterKind":
    """Enter a kind under its name: refused when the name is taken by another kind, when two of its fields
    share a name or one takes a common field's, or when a field's neutral value differs from that of the
    same-named field of a registered kind (a record holds one neutral value per name)."""
    known = _REGISTRY.get(kind.name)
    if known is not None and type(known) is not type(kind):
        raise ValueError(f"two adapter kinds are named {kind.name!r}: {type(known).__name__} and {type(kind).__name__}")
    names = [f.name for f in kind.fields]
    for name in names:
        if name in COMMON_FIELDS or name == "kind_fields" or names.count(name) > 1:
            raise ValueError(f"the adapter kind {kind.name!r} declares the field {name!r} "
                             f"{'twice' if names.count(name) > 1 else 'that every kind has already'}")
    for other in _REGISTRY.values():
        for f in other.fields:
            mine = kind.field(f.name)
            if other.name != kind.name and mine is not None and mine.neutral != f.neutral:
                raise ValueError(f"the adapter kinds {other.name!r} and {kind.name!r} both declare the field "
                                 f"{f.name!r} but with neutral values {f.neutral!r} and {mine.neutral!r}")
    _REGISTRY[kind.name] = kind
    return kind


def registered() -> dict[str, "AdapterKind"]:
    return dict(_REGISTRY)


def get_kind(name: str) -> "AdapterKind":
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown adapter kind {name!r}; expected one of {tuple(_REGISTRY)}") from None


def _record_fields() -> dict[str, KindField]:
    """Every field a registered kind declares, by name (the first declaration; their neutral values agree)."""
    found: dict[str, KindField] = {}
    for kind in _REGISTRY.values():
        for f in kind.fields:
            found.setdefault(f.name, f)
    return found


def _owners(name: str) -> str:
    """The kinds that declare a field, as a message names them ("a, b and c"); "" when none does."""
    names = [k.name for k in _REGISTRY.values() if k.field(name) is not None]
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else ""


def _plain(value: Any) -> Any:
    """A record's value as a config holds it: JSON gives lists where the config keeps tuples."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, init=False, repr=False)
class AdapterConfig:
    """One adapter's shape: the fields every kind has, and its kind's own (`kind_fields`, (name, value) in
    the kind's order; read them as attributes). Two descriptions of the same network compare equal: the
    kind puts its values in canonical form (`AdapterKind.canonical`)."""

    kind: str
    in_dim: int                 # student hidden size (1024 for pig_clip)
    out_dim: int                # teacher row width
    width: int = 1024
    depth: int = 6
    mlp_hidden: int = 0         # 0 = 4·width
    kind_fields: tuple[tuple[str, Any], ...] = ()

    def __init__(self, kind: str, in_dim: int, out_dim: int, width: int = 1024, depth: int = 6,
                 mlp_hidden: int = 0, kind_fields: tuple[tuple[str, Any], ...] = (), **values: Any) -> None:
        spec = get_kind(kind)
        if width % HEAD_DIM or width <= 0:
            raise ValueError(f"adapter width must be a positive multiple of {HEAD_DIM}, got {width}")
        given = {**dict(kind_fields), **values}
        own = {f.name: _plain(given.pop(f.name, f.default)) for f in spec.fields}
        record = _record_fields()
        for name, value in given.items():
            if name in record and _plain(value) == record[name].neutral:
                continue                          # another kind's field, unused: what old records hold
            theirs = _owners(name)
            raise ValueError(f"a {kind} adapter has no field {name!r} "
                             + (f"(it is a field of {theirs} adapters)" if theirs else
                                "(no adapter kind declares it)")
                             + f"; its own fields are {', '.join(own) or 'none'}.")
        for key, value in (("kind", kind), ("in_dim", in_dim), ("out_dim", out_dim), ("width", width),
                           ("depth", depth), ("mlp_hidden", mlp_hidden or 4 * width)):
            object.__setattr__(self, key, value)
        self._set_own(own)
        spec.validate(self)
        fixed = spec.canonical(self)
        if set(fixed) - set(own):
            raise ValueError(f"the adapter kind {kind!r} fixes {sorted(set(fixed) - set(own))}, which it does "
                             f"not declare")
        self._set_own({**own, **fixed})

    def _set_own(self, own: Mapping[str, Any]) -> None:
        object.__setattr__(self, "kind_fields", tuple(own.items()))
        object.__setattr__(self, "_values", dict(own))

    def __getattr__(self, name: str) -> Any:
        """A field of the config's kind; AttributeError for any other name (strict: see the module docstring)."""
        values = self.__dict__.get("_values")
        if values is None or name.startswith("__"):
            raise AttributeError(name)
        if name in values:
            return values[name]
        theirs = _owners(name)
        if theirs:
            raise AttributeError(f"a {self.kind} adapter has no field {name!r} (a field of {theirs} adapters); "
                                 f"ask its kind (config.spec) what it needs")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        parts = [f"{k}={getattr(self, k)!r}" for k in COMMON_FIELDS] + [f"{k}={v!r}" for k, v in self.kind_fields]
        return f"AdapterConfig({', '.join(parts)})"

    @property
    def heads(self) -> int:
        return self.width // HEAD_DIM

    @property
    def mlp(self) -> int:
        return self.mlp_hidden

    @property
    def spec(self) -> "AdapterKind":
        """The kind that runs this config."""
        return get_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        """The record (checkpoints, eval.json): the common fields, then every registered kind's field with
        this config's value, or the field's neutral value where this kind does not have it."""
        values = self.__dict__["_values"]
        return {**{k: getattr(self, k) for k in COMMON_FIELDS},
                **{name: values.get(name, f.neutral) for name, f in _record_fields().items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AdapterConfig":
        """The config of a record (this version's or the previous one's); keys no registered kind declares
        are ignored."""
        known = {*COMMON_FIELDS, *_record_fields()}
        return cls(**{k: v for k, v in data.items() if k in known})


Problem = Any          # adapter_layout.LayoutProblem (a kind's detect returns a list of them)
Names = Mapping[str, tuple[tuple[int, ...], str]]     # "query" → (ne, dtype name), the adapter.* tensors


class AdapterKind:
    """The interface of an adapter kind; a kind module subclasses it and sets `KIND = register(TheKind())`.

    Light parts (no torch): `fields`, `validate`, `canonical`, `claims`, `detect`, `expected_ne`,
    `structural_kvs`, `check_export`, `parameter_count`, `describe`, `head_label`, `shard_keys`. Torch parts:
    `build`, `forward`, `loss`, `score_batch`, `eval_metrics`, `eval_batch`, `rows`/`collate` (the shard
    schema), `infer`."""

    name: ClassVar[str] = ""
    fields: ClassVar[tuple[KindField, ...]] = ()     # its own config fields (a subclass kind adds to its parent's)
    shard_keys: ClassVar[tuple[str, ...]] = ()       # tensors its shard reader needs beyond stream.ROW_KEYS
    optional_shard_keys: ClassVar[tuple[str, ...]] = ()     # tensors its reader reads when a shard has them
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
    @classmethod
    def field(cls, name: str) -> KindField | None:
        """This kind's field of that name, None when it has none."""
        return next((f for f in cls.fields if f.name == name), None)

    def validate(self, c: AdapterConfig) -> None:
        """Raise ValueError naming what the config lacks for this kind."""

    def canonical(self, c: AdapterConfig) -> dict[str, Any]:
        """Own fields in canonical form (taps as ints, a part the kind always or never has), so two
        descriptions of one network compare equal; only fields the kind declares."""
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
        """Every tensor's element count summed. The blocks are alike, so the count is affine in depth: it is taken
        from the layouts of depth 1 and 2 (the plan's depth bisection asks for depths of many thousands, whose
        layouts would list every block's tensors)."""
        if c.depth <= 2:
            return self._count(c)
        one, two = (self._count(dataclasses.replace(c, depth=d)) for d in (1, 2))
        return one + (c.depth - 1) * (two - one)

    def _count(self, c: AdapterConfig) -> int:
        total = 0
        for ne in self.expected_ne(c).values():
            n = 1
            for d in ne:
                n *= d
            total += n
        return total

    def table_count(self, c: AdapterConfig) -> int:
        """Parameters read by index, not multiplied (a seed table): memory, but no FLOPs (the plan's estimate)."""
        return 0

    def frozen_count(self, c: AdapterConfig) -> int:
        """Parameters training does not update (a slot kind's fitted seed table): no gradient or optimizer state
        in memory or in a checkpoint (the plan's estimate)."""
        return 0

    def tap_count(self, c: AdapterConfig) -> int:
        """The teacher layers a target row stacks side by side (the σ floor is then per tap); 0: one layer."""
        return 0

    def vision_width(self, c: AdapterConfig) -> int:
        """The width of the raw vision rows the adapter reads (`infer --vis`), 0 when it reads none."""
        return 0

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
        """Read this kind's shard keys into the shard reader `src` (contract/stream.ShardRows), which has
        refused a shard without one of `shard_keys` already."""

    def collate(self, src: Any, idx: Any, keep_dtype: bool, pin: bool) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------ infer
    def infer(self, c: AdapterConfig, model: Any, hidden: Any, given: Mapping[str, Any]) -> Any:
        """The adapter on one student sequence, batch 1 and no mask, as the engine runs it: rows [R, out]."""
        raise NotImplementedError
