"""Image corpus of the image packs: captioned images → data/train.jsonl and data/val.jsonl.

Each line is `{"text": instruction, "images": ["images/<name>", ...]}`: a single image with a
synthesized edit instruction, two images with a two-image instruction, or text only
(`"images": []`); a sample a pack gave a bank target (the Qwen3.5 bridge's FLUX.3 Klein samples)
adds `"has_bank_target": true` (`"klein": true` in corpora of an earlier version, read the same). The
images come from the presets of `corpus.image_presets` (downloaded
materials) and the folders of `corpus.image_folders`; the text-only share comes from the
prompt sources of the text corpus.

Everything random comes from one `random.Random(corpus.seed)`, drawn in this order: the
shuffle of the pooled images; the single-image instructions; the val instructions; the
two-image pairs and instructions; the shuffle of the text pool; the empty val texts, then
the empty train texts; the shuffle of val.jsonl, then of train.jsonl.

An image that cannot be read or decoded is dropped where it is drawn and the next one is
taken, so only the images a sample uses are ever checked. `plan_corpus` is pure: it asks an
`is_valid(index)` oracle, and the stage plans with "valid" for images not checked yet,
checks (and copies) the images the plan consulted, and plans again until nothing new is
consulted. The last plan only saw real answers, so the output depends on the inputs alone.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from trainer_core.base.atomic import atomic_write_bytes, atomic_write_text
from trainer_core.base.config import CorpusSettings
from trainer_core.base.errors import CorpusError
from trainer_core.base.events import Report
from trainer_core.contract.image_sources import ImageSource, build_sources, safe_name

if TYPE_CHECKING:  # the project layer sits above this one
    from trainer_core.base.folder import ProjectFolder

__all__ = [
    "ADD_THINGS", "STYLES", "BACKGROUNDS", "COLORS", "TWO_IMAGE_PATTERNS", "DETERMINERS", "ADJECTIVES",
    "clean", "subject_from_caption", "caption_categories", "make_instruction", "two_image_instruction",
    "ImageEntry", "Sample", "CorpusPlan", "text_pool", "plan_corpus", "image_decodes", "image_names",
    "build_image_corpus", "BANK_TARGET", "has_bank_target",
]

# a corpus line's flag: the sample also has a bank target; its name in corpora of an earlier version
BANK_TARGET, _OLD_BANK_TARGET = "has_bank_target", "klein"


def has_bank_target(record: Mapping[str, Any]) -> bool:
    """Whether a corpus line (its JSON object) flags a bank target, under this version's key or the old one."""
    return bool(record.get(BANK_TARGET, record.get(_OLD_BANK_TARGET)))


ADD_THINGS = (
    "sunglasses", "a red hat", "a rainbow", "falling snow", "a small bird", "colorful balloons", "a neon sign",
    "fireworks", "a full moon", "fog", "autumn leaves", "a wooden fence", "string lights", "a cup of coffee",
    "a red scarf", "wildflowers", "a butterfly", "graffiti on the wall", "raindrops", "a pair of headphones",
    "a golden crown", "a tiny flag", "candles", "soap bubbles", "a shadow", "sparkles")
STYLES = (
    "night", "winter", "a watercolor painting", "an oil painting", "cyberpunk style", "black and white",
    "vintage sepia", "anime style", "pixel art", "a pencil sketch", "golden hour lighting", "a foggy morning",
    "neon lit", "a comic book style", "a low-poly 3d render", "a claymation scene", "impressionist style")
BACKGROUNDS = (
    "a beach at sunset", "a snowy mountain", "a dense forest", "a futuristic city", "a desert", "outer space",
    "a cozy living room", "an ancient temple", "a rainy street", "a field of flowers", "a library",
    "an underwater scene")
COLORS = ("red", "blue", "green", "golden", "purple", "pink", "white", "black", "orange", "turquoise")
TWO_IMAGE_PATTERNS = (
    "combine the two images into one scene", "put the {cat} from Image 1 into Image 2",
    "blend Image 1 and Image 2 together", "apply the style of Image 2 to Image 1",
    "place the subject of Image 1 next to the subject of Image 2", "{cap}")
DETERMINERS = frozenset(
    "a an are couple few five four group is lots many of one pair several six some that the there this "
    "three two".split())
ADJECTIVES = frozenset(
    "adult african asian baby bearded beautiful big black blond blonde blue bright brown busy colorful "
    "crowded cute dark dirty elderly empty gray green grey happy huge large light little long old orange "
    "pink pretty purple red shirtless short small smiling tall tiny wet white wooden yellow young".split())

_BRACKETS = str.maketrans("", "", "()[]")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


# ---------------------------------------------------------------- instructions (pure)

def clean(text: str) -> str:
    """`text` without ( ) [ ] and with its whitespace collapsed to single spaces."""
    return " ".join(text.translate(_BRACKETS).split())


def subject_from_caption(caption: str) -> str:
    """The first word that names a thing: not a determiner or adjective, 3+ letters; else "subject"."""
    for word in _WORD.findall(caption.lower()):
        if word not in DETERMINERS and word not in ADJECTIVES and len(word) >= 3:
            return word
    return "subject"


def caption_categories(caps: Sequence[str]) -> list[str]:
    """The sorted subjects of an image's captions ("subject", the fallback, left out)."""
    return sorted({subject_from_caption(c) for c in caps} - {"subject"})


def make_instruction(rng: random.Random, caps: Sequence[str], cats: Sequence[str]) -> str:
    """One single-image instruction: a caption, an edit, a restyle, or empty (the row table)."""
    cap = clean(rng.choice(caps)) if caps else ""
    cat = rng.choice(cats) if cats else "subject"
    r = rng.random()
    if r < 0.015:
        return ""
    if r < 0.30 and cap:
        return cap
    if r < 0.42:
        pattern = rng.choice(("add {t}", "add {t} to the image", "the {cat} with {t}"))
        return pattern.format(t=rng.choice(ADD_THINGS), cat=cat)
    if r < 0.50:
        return rng.choice(("remove the {cat}", "remove the {cat} from the image")).format(cat=cat)
    if r < 0.56:
        return f"replace the {cat} with {rng.choice(ADD_THINGS)}"
    if r < 0.68:
        pattern = rng.choice(("make it {s}", "turn this into {s}", "restyle the image as {s}"))
        return pattern.format(s=rng.choice(STYLES))
    if r < 0.76:
        return f"change the background to {rng.choice(BACKGROUNDS)}"
    if r < 0.82:
        return f"make the {cat} {rng.choice(COLORS)}"
    if r < 0.90 and cap:
        return f"{cap}, {rng.choice(STYLES)}"
    if r < 0.94 and cap:
        words = cap.split()
        return " ".join(words[:rng.randint(2, max(2, min(5, len(words))))])
    return cap if cap else f"make it {rng.choice(STYLES)}"


def two_image_instruction(rng: random.Random, caps_a: Sequence[str], caps_b: Sequence[str]) -> str:
    """One instruction for the pair (Image 1 = a, Image 2 = b)."""
    pattern = rng.choice(TWO_IMAGE_PATTERNS)
    cat = subject_from_caption(caps_a[0]) if caps_a else "subject"
    cap = clean(rng.choice(caps_b)) if caps_b else "combine the two images"
    return pattern.format(cat=cat, cap=cap)


# ---------------------------------------------------------------- the plan (pure)

@dataclass(frozen=True)
class ImageEntry:
    source: str                   # "flickr30k", "coco_captions" or a folder's safe name
    key: str                      # unique within the source: file name, "<shard>-<group>-<row>", rel path
    captions: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    text: str
    images: tuple[int, ...]       # indices into the entries; () for a text-only sample
    has_bank_target: bool = False     # also a bank target (the Qwen3.5 bridge's FLUX.3 Klein bank)


@dataclass
class CorpusPlan:
    train: list[Sample]
    val: list[Sample]
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)      # what the pack's draws add to the corpus summary


def text_pool(sources: Iterable[tuple[str, Iterable[str]]]) -> list[str]:
    """Every text cleaned, in source order; empty ones and repeats dropped."""
    pool: dict[str, None] = {}
    for _name, texts in sources:
        for text in texts:
            text = clean(text)
            if text:
                pool.setdefault(text, None)
    return list(pool)


def _always(index: int) -> bool:
    return True


Draws = Callable[[random.Random, list, list, Sequence[ImageEntry]], tuple[Mapping[str, int], Sequence[str]]]


def plan_corpus(entries: Sequence[ImageEntry], texts: Sequence[str], c: CorpusSettings,
                is_valid: Callable[[int], bool] = _always, draws: Draws | None = None) -> CorpusPlan:
    """The samples of both files (see the module docstring for the order of the draws). `draws` are the
    pack's own, made last with the same generator on (rng, val, train, entries), replacing samples in
    place (packs/base.TrainerPack.corpus_draws: the Klein targets, Ming's layer prompts); the counts it returns
    join the plan's, its notes the corpus summary."""
    if len(entries) <= c.n_val_image + 8:
        raise CorpusError(
            f"The image corpus has {len(entries)} images but needs more than {c.n_val_image + 8} "
            f"(corpus.n_val_image = {c.n_val_image} plus 8 for training); add image presets or folders "
            f"(corpus.image_presets, corpus.image_folders) or lower corpus.n_val_image.")
    if len(texts) < c.n_val_text + 8:
        raise CorpusError(
            f"The text share of the image corpus has {len(texts)} usable prompts but needs at least "
            f"{c.n_val_text + 8} (corpus.n_val_text = {c.n_val_text} plus 8 for training); add prompt "
            f"presets or files (corpus.presets, corpus.extra_files) or lower corpus.n_val_text.")
    rng = random.Random(c.seed)
    order = list(range(len(entries)))
    rng.shuffle(order)
    val_pool, train_pool = _split_images(order, c.n_val_image, is_valid)

    def instruction(index: int) -> str:
        caps = entries[index].captions
        return make_instruction(rng, caps, caption_categories(caps))

    singles = []
    for i in range(c.n_image):
        index = _take(train_pool, i, is_valid)
        singles.append(Sample(instruction(index), (index,)))
    val_images = [Sample(instruction(index), (index,)) for index in val_pool]
    pairs = []
    for _ in range(c.n_two):
        a, b = _pair(rng, train_pool, is_valid)
        pairs.append(Sample(two_image_instruction(rng, entries[a].captions, entries[b].captions), (a, b)))

    pool = list(texts)
    rng.shuffle(pool)
    val_texts = pool[:c.n_val_text]
    train_texts = pool[c.n_val_text:c.n_val_text + c.n_text]
    for part in (val_texts, train_texts):
        if part:
            for row in rng.sample(range(len(part)), max(1, int(len(part) * c.empty_frac))):
                part[row] = ""
    val = val_images + [Sample(t, ()) for t in val_texts]
    rng.shuffle(val)
    train = singles + pairs + [Sample(t, ()) for t in train_texts]
    rng.shuffle(train)
    extra, notes = draws(rng, val, train, entries) if draws is not None else ({}, ())
    counts = {"single": len(singles), "two": len(pairs), "text": len(train_texts),
              "text_empty": train_texts.count(""), "val_image": len(val_images),
              "val_text": len(val_texts), "val_text_empty": val_texts.count(""),
              "train_empty": sum(1 for s in train if not s.text), "val_empty": sum(1 for s in val if not s.text),
              "bank_targets": sum(s.has_bank_target for s in train),
              "val_bank_targets": sum(s.has_bank_target for s in val), **extra}
    return CorpusPlan(train, val, counts, list(notes))


def _too_few_decodable(left: int, need: str) -> CorpusError:
    return CorpusError(f"Too many images of the corpus cannot be decoded: {left} usable images are left "
                       f"where {need} are needed; replace the broken image files or add images.")


def _split_images(order: list[int], n_val: int, is_valid: Callable[[int], bool]) -> tuple[list[int], list[int]]:
    """(val, train): the first n_val decodable images, and every image after them."""
    val: list[int] = []
    position = 0
    while len(val) < n_val:
        if position == len(order):
            raise _too_few_decodable(len(val), f"corpus.n_val_image = {n_val}")
        if is_valid(order[position]):
            val.append(order[position])
        position += 1
    return val, order[position:]


def _take(pool: list[int], i: int, is_valid: Callable[[int], bool]) -> int:
    """pool[i % len(pool)], dropping undecodable images from the pool until one decodes."""
    while pool:
        index = pool[i % len(pool)]
        if is_valid(index):
            return index
        del pool[i % len(pool)]
    raise _too_few_decodable(0, "training images")


def _pair(rng: random.Random, pool: list[int], is_valid: Callable[[int], bool]) -> tuple[int, int]:
    """Two different decodable images: the pair is drawn again when one of them is undecodable."""
    while True:
        if len(pool) < 2:
            raise _too_few_decodable(len(pool), "2 training images (corpus.n_two)")
        a, b = rng.sample(pool, 2)
        bad = [index for index in (a, b) if not is_valid(index)]
        if not bad:
            return a, b
        for index in bad:
            pool.remove(index)


def image_names(entries: Sequence[ImageEntry]) -> list[str]:
    """Per entry, the file name under data/images/ without its suffix: "<source>_<safe key stem>",
    with a hash of the key appended where two keys of a source would get the same name."""
    names = [f"{e.source}_{safe_name(_key_stem(e.key), 'image')}" for e in entries]
    repeated = {name for name, n in Counter(names).items() if n > 1}
    return [f"{name}-{hashlib.sha1(e.key.encode()).hexdigest()[:8]}" if name in repeated else name
            for name, e in zip(names, entries)]


def _key_stem(key: str) -> str:
    suffix = Path(key).suffix
    return key[:-len(suffix)] if suffix else key


def image_decodes(data: bytes | None) -> bool:
    """Whether PIL recognises and verifies the bytes as an image (cheap: no full decode)."""
    if not data:
        return False
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Exception:   # noqa: BLE001 — PIL raises many kinds; any of them means "skip this image"
        return False
    return True


# ---------------------------------------------------------------- the stage

class _ImageCheck:
    """The `is_valid` of the plan: images not checked yet count as valid and are queued for checking."""

    def __init__(self) -> None:
        self.valid: dict[int, bool] = {}
        self.queued: set[int] = set()
        self.paths: dict[int, str] = {}      # entry -> "images/<name>" (relative to data/)
        self.written: set[int] = set()       # copied by this run (the others were there already)

    def __call__(self, index: int) -> bool:
        if index in self.valid:
            return self.valid[index]
        self.queued.add(index)
        return True

    @property
    def bad(self) -> int:
        return sum(1 for ok in self.valid.values() if not ok)


def build_image_corpus(project: ProjectFolder, report: Report, should_stop: Callable[[], bool],
                       text_sources: Callable[[], list[tuple[str, Iterable[str]]]],
                       material: Callable[[str], Path]) -> str:
    """The corpus stage of an image pack; `text_sources` gives the prompt sources of the text share, `material`
    the folder of a material (an image preset's dataset)."""
    c = project.settings.corpus
    train_path, val_path = project.corpus_files()
    if train_path.is_file() and val_path.is_file():
        report("log", level="info", message=f"{train_path.name} and {val_path.name} exist in {project.data_dir}; "
                                            f"the image corpus is kept as it is")
        return "done"
    sources = build_sources(project, material)
    entries: list[ImageEntry] = []
    for i, (name, source) in enumerate(sources.items()):
        if should_stop():
            return "stopped"
        report("progress", count=i, total=len(sources), unit="sources", detail=f"listing {name}")
        keys = dict(source.entries())   # a key listed twice keeps its first captions
        entries += [ImageEntry(name, key, caps) for key, caps in keys.items()]
        report("log", level="info", message=f"{name}: {len(keys)} images")
    report("progress", count=len(sources), total=len(sources), unit="sources", detail="reading the text share")
    texts = text_pool(text_sources())
    report("log", level="info", message=f"text share: {len(texts)} distinct prompts")
    names = image_names(entries)
    check = _ImageCheck()
    pack = project.pack
    draws = functools.partial(pack.corpus_draws, c)
    while True:
        plan = plan_corpus(entries, texts, c, check, draws)
        if not check.queued:
            break
        batch, check.queued = sorted(check.queued), set()
        if not _check_and_copy(batch, entries, names, sources, project.data_dir, check, report, should_stop):
            return "stopped"
    _drop_unused_copies(plan, check, project.data_dir)
    if plan.counts["text"] < c.n_text:
        report("log", level="warning", message=f"only {plan.counts['text']} text-only train samples available "
                                               f"(corpus.n_text asks for {c.n_text})")
    if check.bad:
        report("log", level="warning",
               message=f"{check.bad} of the images drawn could not be read or decoded and were skipped")
    atomic_write_text(val_path, _jsonl(plan.val, check.paths))
    atomic_write_text(train_path, _jsonl(plan.train, check.paths))
    _report_done(plan, check, report, train_path, val_path, plan.notes)
    return "done"


def _check_and_copy(batch: list[int], entries: Sequence[ImageEntry], names: list[str],
                    sources: dict[str, ImageSource], data_dir: Path, check: _ImageCheck, report: Report,
                    should_stop: Callable[[], bool]) -> bool:
    """Read, verify and copy (raw bytes) the images of `batch`; False when a stop was requested."""
    by_source: dict[str, dict[str, int]] = {}
    for index in batch:
        by_source.setdefault(entries[index].source, {})[entries[index].key] = index
    done = 0
    for source_name, indices in by_source.items():
        for key, data, suffix in sources[source_name].read(list(indices)):
            index = indices[key]
            check.valid[index] = image_decodes(data)
            if check.valid[index]:
                rel = f"images/{names[index]}{suffix}"
                target = data_dir / rel
                if not (target.is_file() and target.stat().st_size == len(data)):
                    atomic_write_bytes(target, data)
                    check.written.add(index)
                check.paths[index] = rel
            done += 1
            if done % 256 == 0 or done == len(batch):
                report("progress", count=done, total=len(batch), unit="images", detail="checking and copying images")
            if should_stop():
                return False
    return True


def _drop_unused_copies(plan: CorpusPlan, check: _ImageCheck, data_dir: Path) -> None:
    """Images this run copied that the final plan does not use (one drawn again after a broken one)."""
    used = {index for sample in plan.train + plan.val for index in sample.images}
    for index in check.written - used:
        (data_dir / check.paths.pop(index)).unlink(missing_ok=True)
    check.written &= used


def _jsonl(samples: list[Sample], paths: dict[int, str]) -> str:
    def line(s: Sample) -> str:
        record: dict[str, Any] = {"text": s.text, "images": [paths[i] for i in s.images]}
        if s.has_bank_target:
            record[BANK_TARGET] = True
        return json.dumps(record, ensure_ascii=False) + "\n"
    return "".join(line(s) for s in samples)


def _report_done(plan: CorpusPlan, check: _ImageCheck, report: Report, train_path: Path, val_path: Path,
                 notes: Sequence[str] = ()) -> None:
    n = plan.counts
    used = {index for sample in plan.train + plan.val for index in sample.images}
    for path, samples, kind in ((train_path, plan.train, "corpus_train"), (val_path, plan.val, "corpus_val")):
        report("artifact", path=str(path), kind=kind, lines=len(samples), empty=sum(1 for s in samples if not s.text),
               images=len({i for s in samples for i in s.images}))
    report("log", level="info", message=(
        f"{train_path.name}: {n['single']} single-image, {n['two']} two-image and {n['text']} text-only samples "
        f"({n['train_empty']} empty, {n['text_empty']} of them text-only); {val_path.name}: {n['val_image']} image "
        f"and {n['val_text']} text-only samples ({n['val_empty']} empty, {n['val_text_empty']} of them text-only); "
        f"{len(used)} images used ({len(check.written & used)} copied now, the others already in data/images); "
        f"{check.bad} undecodable images skipped" + "".join(f"; {note}" for note in notes if note)))
