"""The corpus stage of the image packs: captioned images -> data/train.jsonl and data/val.jsonl.

The golden instructions below are worked out by hand from the rules of the image corpus
(the row table of make_instruction and the two-image rule), from the raw draws of
random.Random(seed) written next to each case: `choice(seq)` draws `randbelow(len(seq))`,
so "choice/2 -> 1" is the second of two items.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import re
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from trainer_core.base.errors import CorpusError, UsageError
from trainer_core.base.events import ListReport
from trainer_core.contract.image_corpus import (
    ADD_THINGS, BACKGROUNDS, COLORS, STYLES, ImageEntry, caption_categories, clean, image_names, make_instruction,
    plan_corpus, subject_from_caption, two_image_instruction,
)
from trainer_core.contract.image_sources import CocoSource, FlickrSource, FolderSource
from trainer_core.project import Project
from trainer_core.stages.corpus import run

# ---------------------------------------------------------------- clean and subjects


@pytest.mark.parametrize("text, expected", [
    ("A (young) boy   in a [red] shirt plays.", "A young boy in a red shirt plays."),
    ("  [ ( ) ]  ", ""),
    ("tabs\tand\nnew lines", "tabs and new lines"),
    ("{braces} stay <and> these", "{braces} stay <and> these"),
])
def test_clean(text, expected):
    assert clean(text) == expected


@pytest.mark.parametrize("caption, expected", [
    ("A group of young men playing soccer", "men"),       # a, group, of: determiners; young: adjective
    ("Two big dogs run", "dogs"),
    ("An old man's hat", "man's"),                      # the apostrophe belongs to the word
    ("The Tall-man waves", "tall-man"),                 # so does the hyphen; lower-cased
    ("A big red ox", "subject"),                        # "ox" is shorter than 3 letters
    ("3 small cats", "cats"),
    ("", "subject"),
])
def test_subject_from_caption(caption, expected):
    assert subject_from_caption(caption) == expected


def test_caption_categories_are_sorted_and_drop_subject():
    assert caption_categories(["Two dogs", "a boy", "A big red ox", "the dogs again"]) == ["boy", "dogs"]
    assert caption_categories([]) == []


# ---------------------------------------------------------------- make_instruction: the row table

class ScriptedRng:
    """Answers choice / random / randint from a script and records every draw, in order."""

    def __init__(self, r: float, picks: list[int] | None = None, k: int = 0):
        self.r, self.picks, self.k, self.calls = r, list(picks or []), k, []

    def choice(self, seq):
        self.calls.append(("choice", tuple(seq)))
        return seq[self.picks.pop(0)]

    def random(self):
        self.calls.append(("random",))
        return self.r

    def randint(self, a, b):
        self.calls.append(("randint", a, b))
        return self.k


CAPS = ["A (young) boy   in a [red] shirt plays.", "Two dogs run on the grass"]
CATS = ["boy", "dogs"]
CAP0 = "A young boy in a red shirt plays."


@pytest.mark.parametrize("r, picks, k, expected", [
    (0.0, [0, 0], 0, ""),
    (0.0149, [0, 0], 0, ""),
    (0.015, [0, 0], 0, CAP0),
    (0.2999, [1, 0], 0, "Two dogs run on the grass"),
    (0.30, [0, 1, 2, 4], 0, "the dogs with a small bird"),       # pattern 2, ADD_THINGS[4]
    (0.41, [0, 0, 0, 25], 0, "add sparkles"),
    (0.42, [0, 1, 1], 0, "remove the dogs from the image"),
    (0.55, [0, 0, 25], 0, "replace the boy with sparkles"),
    (0.56, [0, 0, 1, 16], 0, "turn this into impressionist style"),
    (0.70, [0, 0, 11], 0, "change the background to an underwater scene"),
    (0.80, [0, 1, 9], 0, "make the dogs turquoise"),
    (0.85, [0, 0, 2], 0, CAP0 + ", a watercolor painting"),
    (0.93, [0, 0], 4, "A young boy in"),
    (0.94, [0, 0], 0, CAP0),
])
def test_make_instruction_rows(r, picks, k, expected):
    rng = ScriptedRng(r, picks, k)
    assert make_instruction(rng, CAPS, CATS) == expected
    assert rng.picks == []                                   # every scripted choice was drawn
    # the caption is drawn first, then the category, then r
    assert rng.calls[:3] == [("choice", tuple(CAPS)), ("choice", tuple(CATS)), ("random",)]


def test_make_instruction_draw_order_of_the_add_row():
    rng = ScriptedRng(0.35, [0, 0, 1, 3])
    assert make_instruction(rng, CAPS, CATS) == "add falling snow to the image"
    assert rng.calls[3:] == [("choice", ("add {t}", "add {t} to the image", "the {cat} with {t}")),
                             ("choice", ADD_THINGS)]


def test_first_words_row_draws_k_from_the_word_count():
    rng = ScriptedRng(0.92, [0], 2)
    assert make_instruction(rng, ["one"], []) == "one"         # 1 word: randint(2, 2)
    assert rng.calls[-1] == ("randint", 2, 2)
    rng = ScriptedRng(0.92, [1], 3)
    assert make_instruction(rng, CAPS, []) == "Two dogs run"  # 6 words: randint(2, 5)
    assert rng.calls[-1] == ("randint", 2, 5)


@pytest.mark.parametrize("r, picks, expected", [
    (0.1, [0, 8], "add a full moon"),               # no caption: the caption row falls through to "add"
    (0.45, [0], "remove the subject"),              # no category: "subject"
    (0.85, [13], "make it a comic book style"),     # caption rows fall through to the last row
    (0.93, [0], "make it night"),
    (0.99, [16], "make it impressionist style"),
])
def test_make_instruction_without_captions(r, picks, expected):
    rng = ScriptedRng(r, picks)
    assert make_instruction(rng, [], []) == expected
    assert rng.calls[0] == ("random",)              # nothing drawn for the missing caption and category


@pytest.mark.parametrize("seed, expected", [
    # seed: choice/2 (caption), choice/2 (category), random() -> row, then the row's draws
    (0, "Two dogs run on the grass"),             # 1, 1, 0.0405 -> caption
    (3, "the boy with wildflowers"),              # 0, 0 boy, 0.3700 -> add: choice/3 -> 2, choice/26 -> 15
    (10, "remove the dogs"),                      # 0, 1 dogs, 0.4826 -> remove: choice/2 -> 0
    (15, "replace the boy with a red hat"),       # 0, 0 boy, 0.5213 -> replace: choice/26 -> 1
    (12, "restyle the image as a foggy morning"),  # 1, 1, 0.6575 -> style: choice/3 -> 2, choice/17 -> 11
    (13, "change the background to a library"),   # 1, 1, 0.6853 -> background: choice/12 -> 10
    (5, "make the dogs orange"),                  # 1, 1 dogs, 0.7952 -> color: choice/10 -> 8
    (34, "Two dogs run on the grass, night"),     # 1, 0, 0.8433 -> caption + style: choice/17 -> 0
    (59, "A young boy in a"),                     # 0, 0, 0.9326 -> first words: randint(2, 5) -> 5
    (8, CAP0),                                    # 0, 1, 0.9623 -> the caption (last row)
    (299, ""),                                    # random() < 0.015 -> empty
])
def test_make_instruction_golden(seed, expected):
    assert make_instruction(random.Random(seed), CAPS, CATS) == expected


@pytest.mark.parametrize("seed, expected", [
    (1, "add a full moon"),                       # random() 0.1344 -> add: choice/3 -> 0, choice/26 -> 8
    (0, "make it a comic book style"),            # random() 0.8444 -> last row: choice/17 -> 13
])
def test_make_instruction_golden_without_captions(seed, expected):
    assert make_instruction(random.Random(seed), [], []) == expected


def test_word_lists():
    assert (len(ADD_THINGS), len(STYLES), len(BACKGROUNDS), len(COLORS)) == (26, 17, 12, 10)
    assert (ADD_THINGS[0], ADD_THINGS[-1], STYLES[-1], BACKGROUNDS[-1], COLORS[-1]) == (
        "sunglasses", "sparkles", "impressionist style", "an underwater scene", "turquoise")


# ---------------------------------------------------------------- two_image_instruction

@pytest.mark.parametrize("seed, caps_a, caps_b, expected", [
    # choice/6 (pattern), then choice/2 (caption of b); the subject of a's first caption needs no draw
    (1, ["Three small dogs sit on a couch"], ["A [man] rides a bike.", "x"],
     "put the dogs from Image 1 into Image 2"),
    (1, [], ["A [man] rides a bike.", "x"], "put the subject from Image 1 into Image 2"),
    (19, ["Three small dogs"], ["A [man] rides a bike.", "x"], "A man rides a bike."),    # pattern 5, caption 0
    (19, ["Three small dogs"], [], "combine the two images"),                           # pattern 5, no caption
    (0, ["Three small dogs"], ["a", "b"], "apply the style of Image 2 to Image 1"),     # pattern 3
])
def test_two_image_instruction_golden(seed, caps_a, caps_b, expected):
    assert two_image_instruction(random.Random(seed), caps_a, caps_b) == expected


# ---------------------------------------------------------------- inputs

def image_bytes(i: int, fmt: str = "PNG") -> bytes:
    """A distinct 8x6 image: its colour depends on i."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), ((37 * i) % 256, (91 * i) % 256, (53 * i + 7) % 256)).save(buf, fmt)
    return buf.getvalue()


FLICKR_IDS = [f"10000{i:02d}" for i in range(12)]


def make_flickr(folder: Path) -> dict[str, bytes]:
    """12 photos in a zip under flickr30k-images/ and their captions in a CSV; returns name -> bytes."""
    folder.mkdir(parents=True)
    out = {}
    with zipfile.ZipFile(folder / "flickr30k-images.zip", "w") as z:
        z.writestr("flickr30k-images/", b"")
        for i, fid in enumerate(FLICKR_IDS):
            out[f"flickr30k_{fid}.jpg"] = data = image_bytes(100 + i, "JPEG")
            z.writestr(f"flickr30k-images/{fid}.jpg", data)
    with open(folder / "flickr_annotations_30k.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["raw", "sentids", "split", "filename", "img_id"])
        w.writeheader()
        for i, fid in enumerate(FLICKR_IDS):
            raw = json.dumps([f"Two dogs play number {i} (outside).", f"A [brown] horse number {i}"])
            w.writerow({"raw": raw, "sentids": "[]", "split": "train", "filename": f"{fid}.jpg", "img_id": i})
    return out


def make_coco(folder: Path) -> dict[str, bytes]:
    """Shard 0: 8 rows in 2 row groups (struct images, list captions); shard 1: 3 rows of raw
    bytes and str captions. Returns the expected data/images name -> bytes."""
    (folder / "data").mkdir(parents=True)
    out, images, captions = {}, [], []
    for row in range(8):
        fmt = "JPEG" if row % 2 else "PNG"
        data = image_bytes(200 + row, fmt)
        path = f"COCO_{row}.jpg" if row < 4 else None          # rows 4-7: suffix from the bytes
        images.append({"bytes": data, "path": path})
        captions.append([f"A cat number {row} on a sofa", "", f"the kitten {row}"])
        suffix = ".jpg" if path else (".jpg" if fmt == "JPEG" else ".png")
        out[f"coco_captions_train-00000-of-00002-{row // 4}-{row % 4}{suffix}"] = data
    table = pa.table({"image": pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "sentences_raw": pa.array(captions, pa.list_(pa.string()))})
    pq.write_table(table, folder / "data" / "train-00000-of-00002.parquet", row_group_size=4)
    raw = [image_bytes(300 + row, "PNG") for row in range(3)]
    pq.write_table(pa.table({"image": pa.array(raw, pa.binary()),
                             "sentences_raw": pa.array([f"a bus number {r}" for r in range(3)])}),
                   folder / "data" / "train-00001-of-00002.parquet")
    for row, data in enumerate(raw):
        out[f"coco_captions_train-00001-of-00002-0-{row}.png"] = data
    return out


def make_folder(folder: Path) -> dict[str, bytes]:
    """a.jpg + a.txt, b.png without captions, sub/c.JPG + sub/c.txt, a corrupt.png, a note."""
    (folder / "sub").mkdir(parents=True)
    files = {"a.jpg": image_bytes(400, "JPEG"), "b.png": image_bytes(401), "sub/c.JPG": image_bytes(402, "JPEG")}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "a.txt").write_text("  A red barn in a field  \n\n a barn at dusk\n", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text("One lighthouse\n", encoding="utf-8")
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image at all")
    (folder / "corrupt.txt").write_text("a broken picture\n", encoding="utf-8")
    (folder / "notes.md").write_text("not an image\n", encoding="utf-8")
    return {f"my_photos__{name.replace('/', '_')}": data for name, data in files.items()}


def make_prompts(path: Path) -> set[str]:
    """40 distinct prompts (a few with brackets, repeated or empty lines); returns them cleaned."""
    lines = [f"prompt number {i} of a (quiet) [lake]" for i in range(40)]
    lines += ["prompt number 3 of a quiet lake", "", "  "]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {f"prompt number {i} of a quiet lake" for i in range(40)}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    expected = {**make_flickr(root / "flickr"), **make_coco(root / "coco"), **make_folder(root / "my photos!")}
    texts = make_prompts(root / "prompts.txt")
    return root, expected, texts


COUNTS = ["corpus.n_val_image=4", "corpus.n_image=40", "corpus.n_two=6", "corpus.n_text=20",
          "corpus.n_val_text=6", "corpus.empty_frac=0.1"]


def image_project(root: Path, inputs_root: Path, *extra: str) -> Project:
    project = Project.create(root, "qwen3vl_mageflow")
    project.update_settings([
        f"materials.images_flickr30k.path={inputs_root / 'flickr'}",
        f"materials.images_coco_captions.path={inputs_root / 'coco'}",
        'corpus.image_presets=["flickr30k","coco_captions"]',
        "corpus.image_folders=" + json.dumps([str(inputs_root / "my photos!")]),
        "corpus.presets=[]",
        "corpus.extra_files=" + json.dumps([str(inputs_root / "prompts.txt")]),
        *COUNTS, *extra,
    ])
    return project


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- the sources

def test_sources_list_keys_and_captions(inputs):
    root, _, _ = inputs
    flickr = list(FlickrSource(root / "flickr").entries())
    assert [k for k, _ in flickr] == [f"{fid}.jpg" for fid in FLICKR_IDS]
    assert flickr[0][1] == ("Two dogs play number 0 (outside).", "A [brown] horse number 0")
    coco = list(CocoSource(root / "coco").entries())
    assert [k for k, _ in coco] == ([f"train-00000-of-00002-{g}-{r}" for g in (0, 1) for r in range(4)]
                                    + [f"train-00001-of-00002-0-{r}" for r in range(3)])
    assert coco[5][1] == ("A cat number 5 on a sofa", "the kitten 5")       # the empty caption dropped
    assert coco[9][1] == ("a bus number 1",)                                # a str caption
    folder = list(FolderSource(root / "my photos!").entries())
    assert folder == [("a.jpg", ("A red barn in a field", "a barn at dusk")), ("b.png", ()),
                      ("corrupt.png", ("a broken picture",)), ("sub/c.JPG", ("One lighthouse",))]


def test_coco_reads_raw_bytes_and_picks_the_suffix(inputs):
    root, expected, _ = inputs
    keys = ["train-00001-of-00002-0-2", "train-00000-of-00002-1-1", "train-00000-of-00002-0-0",
            "train-00000-of-00002-1-0"]
    got = {key: (data, suffix) for key, data, suffix in CocoSource(root / "coco").read(keys)}
    assert got["train-00000-of-00002-0-0"][1] == ".jpg"      # from the struct's path
    assert got["train-00000-of-00002-1-0"][1] == ".png"      # no path, PNG magic
    assert got["train-00000-of-00002-1-1"][1] == ".jpg"      # no path, JPEG bytes
    assert got["train-00001-of-00002-0-2"][1] == ".png"      # raw bytes column
    for key, (data, suffix) in got.items():
        assert expected[f"coco_captions_{key}{suffix}"] == data


def test_image_names_are_safe_and_unique_per_key():
    entries = [ImageEntry("s", key, ()) for key in ("a.jpg", "a.png", "x/y.jpg", "x_y.jpg", "b c!.JPG", "d")]
    entries.append(ImageEntry("t", "a.jpg", ()))

    def hashed(name: str, key: str) -> str:
        return f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"

    assert image_names(entries) == [
        hashed("s_a", "a.jpg"), hashed("s_a", "a.png"),          # same stem, two keys: a hash each
        hashed("s_x_y", "x/y.jpg"), hashed("s_x_y", "x_y.jpg"),  # "/" made "_" collides with "_"
        "s_b_c_", "s_d", "t_a"]                                  # other sources never collide


# ---------------------------------------------------------------- the stage

def test_stage_writes_the_corpus(tmp_path, inputs):
    root, expected, texts = inputs
    project = image_project(tmp_path / "p", root)
    rep = ListReport()
    assert run(project, rep) == "done"
    train = read_jsonl(project.data_dir / "train.jsonl")
    val = read_jsonl(project.data_dir / "val.jsonl")
    assert all(set(s) == {"text", "images"} and isinstance(s["text"], str) for s in train + val)

    # exact counts of each kind
    singles = [s for s in train if len(s["images"]) == 1]
    pairs = [s for s in train if len(s["images"]) == 2]
    train_texts = [s["text"] for s in train if not s["images"]]
    val_images = [s for s in val if len(s["images"]) == 1]
    val_texts = [s["text"] for s in val if not s["images"]]
    assert (len(singles), len(pairs), len(train_texts), len(train)) == (40, 6, 20, 66)
    assert (len(val_images), len(val_texts), len(val)) == (4, 6, 10)
    # empties of the text share: max(1, int(20 * 0.1)) = 2 and max(1, int(6 * 0.1)) = 1
    assert (train_texts.count(""), val_texts.count("")) == (2, 1)
    nonempty_train, nonempty_val = [t for t in train_texts if t], [t for t in val_texts if t]
    assert set(nonempty_train) | set(nonempty_val) <= texts
    assert len(set(nonempty_train + nonempty_val)) == 18 + 5                # no prompt twice
    # no val image in train; the 4 val images are distinct; pairs are two different images
    val_paths = {s["images"][0] for s in val_images}
    train_paths = {p for s in train for p in s["images"]}
    assert len(val_paths) == 4 and not val_paths & train_paths
    assert all(a != b for a, b in (s["images"] for s in pairs))

    # 27 images, 1 corrupt: n_image 40 > the 22 train images, so every image is drawn and copied
    files = {p.name: p.read_bytes() for p in (project.data_dir / "images").iterdir()}
    assert files == expected                                               # raw bytes, nothing else
    assert {p.removeprefix("images/") for p in val_paths | train_paths} == set(expected)
    assert not any("corrupt" in json.dumps(s) for s in train + val)
    warnings = [e["message"] for e in rep.of_type("log") if e["level"] == "warning"]
    assert any(re.search(r"\b1 of the images drawn could not be read or decoded", m) for m in warnings)

    artifacts = {a["kind"]: a for a in rep.of_type("artifact")}
    assert artifacts["corpus_train"]["path"] == str(project.data_dir / "train.jsonl")
    assert (artifacts["corpus_train"]["lines"], artifacts["corpus_val"]["lines"]) == (66, 10)
    summary = rep.of_type("log")[-1]["message"]
    assert "40 single-image, 6 two-image and 20 text-only samples" in summary
    assert "26 images used" in summary and "1 undecodable images skipped" in summary


def test_two_runs_are_byte_identical(tmp_path, inputs):
    root, _, _ = inputs
    outputs = []
    for name in ("p1", "p2"):
        project = image_project(tmp_path / name, root)
        assert run(project, ListReport()) == "done"
        outputs.append([(project.data_dir / f).read_bytes() for f in ("train.jsonl", "val.jsonl")]
                       + [sorted(p.name for p in (project.data_dir / "images").iterdir())])
    assert outputs[0] == outputs[1]


def test_another_seed_gives_another_corpus(tmp_path, inputs):
    root, _, _ = inputs
    a, b = image_project(tmp_path / "a", root), image_project(tmp_path / "b", root, "corpus.seed=9")
    for project in (a, b):
        assert run(project, ListReport()) == "done"
    assert (a.data_dir / "train.jsonl").read_bytes() != (b.data_dir / "train.jsonl").read_bytes()


def test_only_used_images_are_copied(tmp_path, inputs):
    root, expected, _ = inputs
    project = image_project(tmp_path / "p", root, "corpus.n_image=3", "corpus.n_two=1")
    assert run(project, ListReport()) == "done"
    used = {p for s in read_jsonl(project.data_dir / "train.jsonl") + read_jsonl(project.data_dir / "val.jsonl")
            for p in s["images"]}
    files = {p.name for p in (project.data_dir / "images").iterdir()}
    assert files == {p.removeprefix("images/") for p in used}
    assert 5 <= len(files) <= 9                          # 4 val + 3 single + up to 2 per pair
    for name in files:
        assert (project.data_dir / "images" / name).read_bytes() == expected[name]


def test_a_rerun_keeps_existing_copies(tmp_path, inputs):
    root, _, _ = inputs
    project = image_project(tmp_path / "p", root)
    assert run(project, ListReport()) == "done"
    before = {p.name: p.stat().st_mtime_ns for p in (project.data_dir / "images").iterdir()}
    for name in ("train.jsonl", "val.jsonl"):
        (project.data_dir / name).unlink()
    rep = ListReport()
    assert run(project, rep) == "done"
    assert {p.name: p.stat().st_mtime_ns for p in (project.data_dir / "images").iterdir()} == before
    assert "(0 copied now" in rep.of_type("log")[-1]["message"]


def test_plan_drops_an_undecodable_image_and_draws_the_next():
    from trainer_core.base.config import CorpusSettings
    entries = [ImageEntry("s", f"{i}.png", (f"a dog number {i}",)) for i in range(20)]
    c = CorpusSettings(n_image=30, n_two=5, n_text=3, n_val_image=4, n_val_text=2, seed=8)
    texts = [f"text {i}" for i in range(12)]
    full = plan_corpus(entries, texts, c)
    bad = full.val[0].images[0] if full.val[0].images else full.val[1].images[0]
    plan = plan_corpus(entries, texts, c, lambda i: i != bad)
    used = [i for s in plan.train + plan.val for i in s.images]
    assert bad in [i for s in full.train + full.val for i in s.images] and bad not in used
    assert (plan.counts["single"], plan.counts["two"], plan.counts["val_image"]) == (30, 5, 4)


def test_layer_prompts_replace_single_image_samples_and_leave_the_rest_alone():
    """n_layer / n_val_layer single-image samples take the pack's layer instruction over one of their
    image's captions (Ming's corpus_draws); pairs, text samples and the images chosen stay as they were;
    at 0 nothing is drawn, so the corpus is the one every other pack gets."""
    import functools

    from trainer_core.base.config import CorpusSettings
    from trainer_core.packs.ming_image import PACK as MING
    from trainer_core.packs.ming_image.template import layer_count
    entries = [ImageEntry("s", f"{i}.png", (f"a dog number {i}",)) for i in range(40)]
    texts = [f"text {i}" for i in range(30)]

    def settings(n_layer: int, n_val_layer: int) -> CorpusSettings:
        return CorpusSettings(n_image=20, n_two=4, n_text=6, n_val_image=6, n_val_text=3, seed=3,
                              pack_values={"n_layer": n_layer, "n_val_layer": n_val_layer})
    c = settings(0, 0)
    plain = plan_corpus(entries, texts, c)
    none = plan_corpus(entries, texts, c, draws=functools.partial(MING.corpus_draws, c))
    assert (none.train, none.val) == (plain.train, plain.val) and none.counts["layer"] == 0
    c = settings(5, 2)
    layered = plan_corpus(entries, texts, c, draws=functools.partial(MING.corpus_draws, c))
    assert (layered.counts["layer"], layered.counts["val_layer"]) == (5, 2)
    for before, after in ((plain.train, layered.train), (plain.val, layered.val)):
        assert [s.images for s in before] == [s.images for s in after]
        changed = [(b, a) for b, a in zip(before, after) if b.text != a.text]
        for b, a in changed:
            assert len(a.images) == 1 and 2 <= layer_count(a.text) <= 8
            assert f"a dog number {a.images[0]}" in a.text          # a caption of that sample's image
    assert sum(b.text != a.text for b, a in zip(plain.train, layered.train)) == 5
    assert sum(b.text != a.text for b, a in zip(plain.val, layered.val)) == 2
    assert layered.notes == ["5 train and 2 val samples ask for a layer decomposition"]
    assert none.notes == []


def test_bank_targets_are_drawn_written_and_read_under_their_name_and_the_old_one(tmp_path):
    """The Qwen3.5 bridge's corpus_draws flag n_klein / n_val_klein samples with a bank target; the corpus
    line says `"has_bank_target": true`, and a line of an earlier version (`"klein": true`) reads the same."""
    import functools
    from types import SimpleNamespace

    from trainer_core.base.config import CorpusSettings
    from trainer_core.contract.image_corpus import _jsonl
    from trainer_core.packs.qwen35_bridge import PACK as BRIDGE
    entries = [ImageEntry("s", f"{i}.png", (f"a dog number {i}",)) for i in range(40)]
    c = CorpusSettings(n_image=20, n_two=4, n_text=6, n_val_image=6, n_val_text=3, seed=3,
                       pack_values={"n_klein": 5, "n_val_klein": 2})
    plan = plan_corpus(entries, [f"text {i}" for i in range(30)], c, draws=functools.partial(BRIDGE.corpus_draws, c))
    assert (plan.counts["bank_targets"], plan.counts["val_bank_targets"]) == (5, 2)
    lines = _jsonl(plan.train, {i: f"images/{i}.png" for i in range(40)}).splitlines()
    assert sum(json.loads(line).get("has_bank_target", False) for line in lines) == 5
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "images": [], "klein": true}\n{"text": "b", "images": [], "has_bank_target": '
                    'true}\n{"text": "c", "images": []}\n', encoding="utf-8")
    samples = BRIDGE.corpus_kind.read_samples(SimpleNamespace(data_dir=tmp_path), path)
    assert [s["has_bank_target"] for s in samples] == [True, True, False]


# ---------------------------------------------------------------- skipping and errors

def test_existing_files_skip_the_stage(tmp_path):
    project = Project.create(tmp_path / "p", "qwen3vl_mageflow")     # flickr30k not downloaded: not needed
    train, val = project.corpus_files()
    assert (train.name, val.name) == ("train.jsonl", "val.jsonl")
    project.data_dir.mkdir()
    train.write_text('{"text": "mine", "images": []}\n', encoding="utf-8")
    val.write_text('{"text": "my val", "images": []}\n', encoding="utf-8")
    rep = ListReport()
    assert run(project, rep) == "done"
    assert train.read_text(encoding="utf-8") == '{"text": "mine", "images": []}\n'
    assert sorted(p.name for p in project.data_dir.iterdir()) == ["train.jsonl", "val.jsonl"]
    assert [e["level"] for e in rep.of_type("log")] == ["info"] and rep.of_type("artifact") == []


def test_a_missing_preset_names_the_download(tmp_path):
    project = Project.create(tmp_path / "p", "qwen3vl_mageflow")
    project.update_settings(["corpus.presets=[]"])
    with pytest.raises(UsageError) as info:
        run(project, ListReport())
    assert "download" in str(info.value) and "nlphuji/flickr30k" in str(info.value)
    assert not project.data_dir.exists()


def test_too_few_images(tmp_path, inputs):
    root, _, _ = inputs
    project = image_project(tmp_path / "p", root, "corpus.image_presets=[]")   # the folder's 4 images only
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    msg = str(info.value)
    assert "has 4 images but needs more than 12" in msg and "corpus.n_val_image" in msg
    assert msg.endswith(".") and msg.count(". ") == 0                       # one sentence
    assert not project.data_dir.exists()


def test_too_few_prompts(tmp_path, inputs):
    root, _, _ = inputs
    project = image_project(tmp_path / "p", root, "corpus.n_val_text=33")     # 40 prompts < 33 + 8
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert "40 usable prompts but needs at least 41" in str(info.value)
    assert not project.data_dir.exists()


def test_a_stop_request_writes_no_corpus(tmp_path, inputs):
    root, _, _ = inputs
    project = image_project(tmp_path / "p", root)
    assert run(project, ListReport(), should_stop=lambda: True) == "stopped"
    assert not project.data_dir.exists()


def test_a_stop_while_copying_then_a_rerun_gives_the_same_corpus(tmp_path, inputs):
    root, _, _ = inputs
    calls = []

    def stop_at_the_third_image() -> bool:
        calls.append(1)
        return len(calls) >= 3 + 3       # 3 sources listed, then one call per image checked

    stopped = image_project(tmp_path / "stopped", root)
    assert run(stopped, ListReport(), should_stop=stop_at_the_third_image) == "stopped"
    assert sorted(p.name for p in stopped.data_dir.iterdir()) == ["images"]
    assert len(list((stopped.data_dir / "images").iterdir())) <= 3
    assert run(stopped, ListReport()) == "done"
    fresh = image_project(tmp_path / "fresh", root)
    assert run(fresh, ListReport()) == "done"
    for name in ("train.jsonl", "val.jsonl"):
        assert (stopped.data_dir / name).read_bytes() == (fresh.data_dir / name).read_bytes()
