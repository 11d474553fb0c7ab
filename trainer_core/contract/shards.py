"""Precomputed shards: file layout, the CONTRACT marker, stale handling, target statistics.

One shard is `shards/<split>/<split>-NNNNN.safetensors` (memory-mappable, no pickle), written
to a temp name, fsynced and renamed: a file under its final name is complete, a shard that
exists is done — unless it was damaged since: a shard whose safetensors header does not parse, or
that is shorter than its header says (`shard_intact`, cheap), or whose header names another split
or index than its file name (a copy of another shard), is not counted. Its header also records the
sha256 of its data section (`data_sha256`): `shard_problem` reads the data once per process and
compares, so train and eval refuse a shard whose bytes changed, naming it, and a run's precompute
deletes and recomputes exactly the shards that fail. The schema (docs/SHARDS.md):

    tensors   ids      int32 [T]           student token ids of every sample, packed
              len      int32 [S]           student tokens per sample (offsets = cumsum)
              q_pack   bf16  [T, in_dim]   the student's final-norm rows
              t_pack   bf16  [R, out_dim]  the teacher's target rows the pack supervises, packed
              t_len    int32 [S]           target rows per sample
              stat_s   f64   [out_dim]     Σx over t_pack      } running target moments,
              stat_s2  f64   [out_dim]     Σx² over t_pack     } summed over the train
              stat_n   int64 [1]           rows in t_pack      } shards for μ and σ
              + pack extras (seeded: seed_ids int32 [S, window], seed_len int32 [S]; layerwise:
                n_real int32 [S], pad_multiple int32 [1], n_taps int32 [1], and `len` = `t_len` =
                n_real + 1: the real rows and ONE pad row, which the reader repeats)
    metadata  one key, "gguf_trainer": JSON {"data_sha256": sha256 of the bytes after the header,
                             "meta": {pack, kind, contract, mock_teacher, teacher_mode, student,
                             split, shard, samples, in_dim, out_dim, num_queries, storage},
                             "prompts": [the S prompts in the shard's (length-sorted) order]}
                             (one key: safetensors writes its metadata map in hash order, so
                             several keys would change the bytes per run; shards written before
                             data_sha256 have none and are checked by their header alone)

`shards/<split>/CONTRACT` holds the contract the split's shards were written under: the
pack's contract string, plus " mock-teacher" when the targets are synthetic. Shards under
any other contract are stale: they are deleted, and the checkpoints trained on them move to
`checkpoints.stale-<time>/`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from trainer_core.base.atomic import atomic_path, atomic_write_text
from trainer_core.base.errors import ModelFileError
from trainer_core.contract import checkpoints
from trainer_core.contract.engine_bpe import TOKENIZATION

if TYPE_CHECKING:  # torch stays out of the CLI's and the driver's imports
    from trainer_core.base.folder import ProjectFolder
    import torch

__all__ = [
    "MOCK_ENV", "mock_enabled", "contract_for", "shard_path", "shard_files", "write_shard", "Shard",
    "read_contract", "prepare_split", "expected_shards", "valid_shards", "complete_shards", "shard_intact",
    "load_stats", "split_lines", "target_moments", "rebuild_command", "shard_rebuild_command", "shard_problem",
    "split_complete",
]

MOCK_ENV = "GGUF_TRAINER_MOCK_TEACHER"
_NAME = re.compile(r"^(val|train)-(\d{5})\.safetensors$")
_MAX_HEADER = 100 << 20            # safetensors' own limit on the header's length
_PLACEHOLDER = "0" * 64            # data_sha256 while the data is written; the digest takes its bytes
_DIGEST_KEY = b'data_sha256\\": \\"'   # how the key stands in the header (JSON inside a JSON string)
_intact: dict[tuple[str, int, int], bool] = {}     # (path, size, mtime_ns) → shard_intact's answer


def mock_enabled(project: ProjectFolder) -> bool:
    """Synthetic targets: the project setting or GGUF_TRAINER_MOCK_TEACHER (anything but "" / "0")."""
    return project.settings.precompute.mock_teacher or os.environ.get(MOCK_ENV, "") not in ("", "0")


def contract_for(project: ProjectFolder) -> str:
    """What the shards of this project must have been written under: the pack's contract, the
    tokenization (engine_bpe.TOKENIZATION) and whether the teacher was the mock."""
    mock = " mock-teacher" if mock_enabled(project) else ""
    return f"{project.pack.shard_contract_of(project)} {TOKENIZATION}{mock}"


def shard_path(project: ProjectFolder, split: str, index: int) -> Path:
    return project.shards_dir(split) / f"{split}-{index:05d}.safetensors"


def shard_files(project: ProjectFolder, split: str) -> list[Path]:
    folder = project.shards_dir(split)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name) and p.name.startswith(split))


def read_contract(project: ProjectFolder, split: str) -> str | None:
    try:
        text = (project.shards_dir(split) / "CONTRACT").read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, UnicodeDecodeError):
        return None              # none readable: the split counts as unmarked (a run's layout check names a folder)
    return text or None


def split_lines(project: ProjectFolder, split: str) -> int:
    from trainer_core.contract.corpus_files import read_corpus
    train, val = project.corpus_files()
    path = val if split == "val" else train
    return len(read_corpus(path)) if path.is_file() else 0


def expected_shards(project: ProjectFolder, split: str, lines: int | None = None) -> int:
    p = project.settings.precompute
    size = p.val_shard_size if split == "val" else p.shard_size
    lines = split_lines(project, split) if lines is None else lines
    return max(1, math.ceil(lines / size))


def _index_of(path: Path) -> tuple[str, int] | None:
    m = _NAME.match(path.name)
    return (m.group(1), int(m.group(2))) if m else None


def valid_shards(project: ProjectFolder, split: str, verify: bool = False) -> list[Path]:
    """The split's intact shards that are what their names say, or none when they were written under another
    contract; `verify` also reads each one's data against its digest (shard_problem; once per process)."""
    if read_contract(project, split) != contract_for(project):
        return []
    check = shard_problem if verify else _header_problem
    return [p for p in shard_files(project, split) if shard_intact(p) and check(p) is None]


def split_complete(project: ProjectFolder, split: str, verify: bool = False) -> bool:
    """Whether every shard the corpus needs is on disk, whole and under its own name."""
    have = {p.name for p in valid_shards(project, split, verify)}
    return all(shard_path(project, split, i).name in have for i in range(expected_shards(project, split)))


def complete_shards(project: ProjectFolder, split: str) -> list[Path]:
    """Every shard of the split, for a stage that reads them all (train, eval), each read once against its digest:
    ModelFileError naming the damaged or missing ones and the command that rebuilds them rather than a run on
    part of the data, or on data that is not what precompute wrote."""
    rebuild = rebuild_command(project.root, split)
    files = shard_files(project, split)
    if not files or read_contract(project, split) != contract_for(project):
        raise ModelFileError(f"{project.shards_dir(split)} holds no {split} shards under the current contract; "
                             f"run precompute first ({rebuild}).")
    wanted = [shard_path(project, split, i) for i in range(expected_shards(project, split))]
    wrong = [f"{p.name}: missing" if not p.exists() else
             f"{p.name}: damaged, shorter than its header says or not a shard" if not shard_intact(p) else
             f"{p.name}: damaged, {why}" if (why := shard_problem(p)) else "" for p in wanted]
    wrong = [w for w in wrong if w]
    if wrong:
        raise ModelFileError(f"The {split} shards in {project.shards_dir(split)} are not the {len(wanted)} precompute "
                             f"wrote ({'; '.join(wrong)}); run {rebuild} to compute "
                             f"{'them' if len(wrong) > 1 else 'it'} again.")
    return wanted


def rebuild_command(root: Path | str, split: str) -> str:
    """The command that computes a split's shards again, in backticks (for messages)."""
    return f"`gguf-trainer run --project {root} --only precompute_{split}`"


def shard_rebuild_command(path: Path, split: str | None = None) -> str:
    """rebuild_command for the shard at `path`: its project is the folder above shards/<split>/ (DIR when
    the shard lies elsewhere), its split `split` or its folder's name."""
    split = split or path.parent.name
    in_project = len(path.parents) > 2 and path.parent.parent.name == "shards"
    return rebuild_command(path.parents[2] if in_project else "DIR", split)


def shard_intact(path: Path) -> bool:
    """Whether the safetensors header parses and the file is as long as the header says (a few KB
    read, remembered per size and mtime): a truncated or overwritten shard is not."""
    try:
        st = path.stat()
    except OSError:
        return False
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _intact:
        if len(_intact) > 50_000:
            _intact.clear()
        _intact[key] = _header_fits(path, st.st_size)
    return _intact[key]


def _header_fits(path: Path, size: int) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            n = struct.unpack("<Q", head)[0]
            if n > _MAX_HEADER or 8 + n > size:
                return False
            header = json.loads(f.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return isinstance(header, dict) and 8 + n + max(ends, default=0) <= size


_checked: dict[tuple[str, int, int, bool], str | None] = {}


def _read_record(path: Path) -> tuple[int, dict]:
    """(the header's length, the shard's gguf_trainer record) from its header; ValueError when it has none."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return n, json.loads((header.get("__metadata__") or {})["gguf_trainer"])


def _problem(path: Path, data: bool) -> str | None:
    try:
        st = path.stat()
    except OSError:
        return "missing"
    key = (str(path), st.st_size, st.st_mtime_ns, data)
    if key not in _checked:
        if len(_checked) > 50_000:
            _checked.clear()
        _checked[key] = _check(path, data)
    return _checked[key]


def _check(path: Path, data: bool) -> str | None:
    try:
        n, record = _read_record(path)
        meta = record["meta"]
        named = _index_of(path)
        if named is not None and (meta.get("split"), meta.get("shard")) != named:
            return (f"it holds {meta.get('split')} shard {meta.get('shard')}'s data: a copy of another shard under "
                    f"this name")
        want = record.get("data_sha256")
        if not data or want is None:          # written before shards carried their digest: the header only
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            f.seek(8 + n)
            while block := f.read(1 << 22):
                digest.update(block)
    except (OSError, ValueError, TypeError, KeyError, struct.error):
        return "its header cannot be read"
    if digest.hexdigest() != want:
        return "its data changed since precompute wrote it"
    return None


def _header_problem(path: Path) -> str | None:
    """What is wrong with the shard by its header alone (None: nothing): a copy of another shard."""
    return _problem(path, False)


def shard_problem(path: Path) -> str | None:
    """What is wrong with the shard at `path`, in words (None: nothing): a copy of another shard under its name, or
    data bytes that are not those its digest was taken of. The data is read once per process and size and mtime."""
    return _problem(path, True)


def prepare_split(project: ProjectFolder, split: str, log: Callable[[str], None], clean_temps: bool = True) -> None:
    """Discard the split's shards if they were written under another contract, and any damaged shard
    (`shard_intact`), then mark it. `clean_temps` removes every leftover temp file (with several
    ranks, each removes its own: `remove_temps`)."""
    want = contract_for(project)
    have = read_contract(project, split)
    folder = project.shards_dir(split)
    stale = shard_files(project, split)
    if stale and have != want:
        why = f'written under "{have}"' if have else "written without a CONTRACT marker"
        for path in stale:
            path.unlink()
        log(f"{split} shards discarded: {len(stale)} were {why}, this run needs \"{want}\""
            + ("" if have and TOKENIZATION in have else
               " (this version tokenizes prompts exactly as the engine does, so their token ids change)"))
        archived = checkpoints.archive(project)
        if archived is not None:
            log(f"the checkpoints trained on them moved to {archived.name}/; training starts over")
    if clean_temps:
        remove_temps(project, split)
    # a shard under its final name is whole when written: one that is not, or whose bytes or name are not
    # those precompute wrote, was damaged since
    damaged = [(path, "truncated or overwritten") if not shard_intact(path) else (path, shard_problem(path))
               for path in shard_files(project, split)]
    damaged = [(path, why) for path, why in damaged if why]
    for path, _ in damaged:
        path.unlink(missing_ok=True)
    if damaged:
        log(f"{split} shards {'; '.join(f'{p.name} ({why})' for p, why in damaged)} were damaged: deleted, "
            f"they are computed again")
    if have != want:
        atomic_write_text(folder / "CONTRACT", want + "\n")


def remove_temps(project: ProjectFolder, split: str, indices: "set[int] | None" = None) -> None:
    """Delete the temp files of shards that were in flight when a run died (of `indices` only, when
    given: another rank may be writing the others right now)."""
    folder = project.shards_dir(split)
    for tmp in folder.glob(".*.tmp") if folder.is_dir() else []:
        match = re.match(rf"^\.{split}-(\d+)\.safetensors\.", tmp.name)
        if indices is None or (match and int(match.group(1)) in indices):
            tmp.unlink(missing_ok=True)


def write_shard(path: Path, tensors: dict[str, "torch.Tensor"], meta: dict[str, Any], prompts: list[str]) -> None:
    """The shard, atomically, with the sha256 of its data section in its header: written with a placeholder of
    the digest's length, the data read back and hashed, the placeholder's bytes overwritten in place."""
    from safetensors.torch import save_file
    record = {"data_sha256": _PLACEHOLDER, "meta": meta, "prompts": prompts}
    metadata = {"gguf_trainer": json.dumps(record, sort_keys=True, ensure_ascii=False)}
    needs = sum(v.element_size() * v.numel() for v in tensors.values()) + len(metadata["gguf_trainer"])
    with atomic_path(path, needs=needs) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        with open(tmp, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = f.read(n)
            at = header.find(_DIGEST_KEY + _PLACEHOLDER.encode())     # the first key of the sorted record
            if at < 0:
                raise RuntimeError("safetensors wrote the shard's metadata in a form this version cannot read back")
            digest = hashlib.sha256()
            while block := f.read(1 << 22):
                digest.update(block)
            f.seek(8 + at + len(_DIGEST_KEY))
            f.write(digest.hexdigest().encode())


class Shard:
    """A shard opened memory-mapped; tensors are read on demand."""

    def __init__(self, path: str | os.PathLike):
        from safetensors import safe_open
        self.path = Path(path)
        try:
            self._file = safe_open(str(self.path), framework="pt")
            record = json.loads((self._file.metadata() or {})["gguf_trainer"])
            self.meta: dict[str, Any] = record["meta"]
            self.prompts: list[str] = record["prompts"]
        except FileNotFoundError:
            raise ModelFileError(f"the shard {self.path} does not exist") from None
        except Exception as e:  # safetensors raises its own errors on short or bad headers
            raise ModelFileError(f"the shard {self.path} is damaged ({' '.join(str(e).split())}); delete it "
                                 f"and run precompute again") from None
        self.keys = set(self._file.keys())

    def __getitem__(self, key: str) -> "torch.Tensor":
        return self._file.get_tensor(key)

    def __len__(self) -> int:
        return len(self.prompts)


def target_moments(rows: "torch.Tensor", prefix: str = "stat") -> dict[str, "torch.Tensor"]:
    """A shard's running target moments over `rows` [N, D]: {prefix_s: Σx, prefix_s2: Σx² (float64
    [D]), prefix_n: [N]}, accumulated a block of rows at a time — the whole shard in float64 would be
    4× its bf16 rows and the squares as much again (2.7 GB for the 335 MB of a 256-prompt LLaDA shard)."""
    import torch
    n, dim = int(rows.shape[0]), int(rows.shape[1])
    s = torch.zeros(dim, dtype=torch.float64)
    s2 = torch.zeros(dim, dtype=torch.float64)
    step = max(1, (1 << 21) // max(dim, 1))           # 2M values: 16 MB of float64 per block
    for start in range(0, n, step):
        x = rows[start:start + step].double()           # [≤ step, D]
        s += x.sum(0)
        s2 += (x * x).sum(0)
    return {f"{prefix}_s": s, f"{prefix}_s2": s2, f"{prefix}_n": torch.tensor([n], dtype=torch.int64)}


def load_stats(project: ProjectFolder, sigma_floor: float, n_taps: int = 0, prefix: str = "stat"
               ) -> tuple["torch.Tensor", "torch.Tensor", int]:
    """(μ, σ_f, number of floored dims) from the running moments of the train shards; with `n_taps`
    (layerwise rows) the floor is relative, per tap (tap_losses.relative_sigma). `prefix` "bstat": the
    bridge's bank moments."""
    from trainer_core.contract.losses import target_stats
    files = complete_shards(project, "train")
    s = s2 = None
    n = 0
    for path in files:
        shard = Shard(path)
        s = shard[f"{prefix}_s"] if s is None else s + shard[f"{prefix}_s"]
        s2 = shard[f"{prefix}_s2"] if s2 is None else s2 + shard[f"{prefix}_s2"]
        n += int(shard[f"{prefix}_n"][0])
    if n == 0:
        raise ModelFileError(f"The train shards hold no {'FLUX.3 Klein bank' if prefix == 'bstat' else 'target'} "
                             "rows to standardize by; raise corpus.n_klein (or turn train.klein_head off) and "
                             "precompute again." if prefix == "bstat" else "The train shards hold no target rows.")
    if n_taps:
        from trainer_core.contract.tap_losses import relative_sigma
        return relative_sigma(s, s2, n, sigma_floor, n_taps)
    mu, sigma = target_stats(s, s2, n, sigma_floor)
    raw = (s2 / n - (s / n) ** 2).clamp_min(0).sqrt()
    return mu, sigma, int((raw < sigma_floor).sum())
