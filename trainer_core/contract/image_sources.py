"""Where the image corpus finds captioned images: the preset materials and the user's folders.

A source lists its images as `(key, captions)` pairs, in a fixed order, without reading any
image, and reads the bytes of chosen keys on request, in storage order (the zip's order, one
parquet row group at a time), as `(key, bytes or None, suffix)`; None means unreadable.

    flickr30k       the first *.csv (columns `filename`, `raw`: a JSON list of captions) and
                    the first *.zip of the material, whose members are found by base name
    coco_captions   data/*.parquet: `image` (a struct with `bytes`/`path`, or raw bytes) and
                    `sentences_raw` (a list of str, or a str); key "<shard stem>-<group>-<row>"
    a folder        .jpg .jpeg .png .webp .bmp at any depth, captions from `<name>.txt` beside
                    each image (one a line); key = the path relative to the folder
"""
from __future__ import annotations

import csv
import json
import re
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Optional, Protocol, TYPE_CHECKING

from trainer_core.base.errors import CorpusError

if TYPE_CHECKING:  # the project layer sits above this one
    from trainer_core.base.folder import ProjectFolder

__all__ = ["IMAGE_SUFFIXES", "ImageSource", "FlickrSource", "CocoSource", "FolderSource", "build_sources",
           "safe_name"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

Listing = Iterator[tuple[str, tuple[str, ...]]]
Reading = Iterator[tuple[str, Optional[bytes], str]]


class ImageSource(Protocol):
    def entries(self) -> Listing: ...                   # (key, captions) of every image, in a fixed order
    def read(self, keys: list[str]) -> Reading: ...     # (key, bytes or None, suffix) of each key


def safe_name(text: str, fallback: str) -> str:
    """`text` with every run of other characters than letters, digits, . _ - made "_", last 80 kept."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[-80:] or fallback


def _captions(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else (value or [])
    return tuple(s.strip() for s in items if isinstance(s, str) and s.strip())


def _first(folder: Path, pattern: str, what: str, material: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise CorpusError(f"The {material} material at {folder} has no {what} ({pattern}); download it again "
                          f"with `gguf-trainer download`.")
    return found[0]


class FlickrSource:
    def __init__(self, folder: Path):
        self.csv = _first(folder, "*.csv", "captions file", "images_flickr30k")
        self.zip = _first(folder, "*.zip", "image archive", "images_flickr30k")

    def entries(self) -> Listing:
        with open(self.csv, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if not {"filename", "raw"} <= set(reader.fieldnames or ()):
                raise CorpusError(f"{self.csv} has no `filename` and `raw` columns; download the images_flickr30k "
                                  f"material again.")
            for row in reader:
                try:
                    captions = json.loads(row["raw"] or "[]")
                except json.JSONDecodeError:
                    raise CorpusError(f"{self.csv} line {reader.line_num}: the `raw` column is not a JSON list of "
                                      f"captions; download the images_flickr30k material again.") from None
                if row["filename"]:
                    yield row["filename"], _captions(captions)

    def read(self, keys: list[str]) -> Reading:
        try:
            archive = zipfile.ZipFile(self.zip)
        except (zipfile.BadZipFile, OSError) as e:
            raise CorpusError(f"{self.zip} cannot be opened as a zip archive ({e}); download the images_flickr30k "
                              f"material again.") from None
        with archive:
            members = {PurePosixPath(i.filename).name: i for i in archive.infolist() if not i.is_dir()}
            for key in sorted(keys, key=lambda k: members[k].header_offset if k in members else -1):
                try:
                    data = archive.read(members[key])
                except (KeyError, zipfile.BadZipFile, OSError, ValueError):  # missing or damaged member
                    data = None
                yield key, data, PurePosixPath(key).suffix


class CocoSource:
    def __init__(self, folder: Path):
        _first(folder, "data/*.parquet", "parquet shards", "images_coco_captions")
        self.files = {p.stem: p for p in sorted(folder.glob("data/*.parquet"))}

    def _open(self, path: Path) -> Any:
        import pyarrow.parquet as pq
        try:
            parquet = pq.ParquetFile(path)
        except Exception as e:   # noqa: BLE001 — pyarrow's errors are many; the file is unusable either way
            raise CorpusError(f"{path} cannot be read as parquet ({e}); download the images_coco_captions "
                              f"material again.") from None
        if not {"image", "sentences_raw"} <= set(parquet.schema_arrow.names):
            raise CorpusError(f"{path} has no `image` and `sentences_raw` columns; download the "
                              f"images_coco_captions material again.")
        return parquet

    def entries(self) -> Listing:
        for stem, path in self.files.items():
            parquet = self._open(path)
            for group in range(parquet.num_row_groups):   # one row group at a time: memory stays low
                column = parquet.read_row_group(group, columns=["sentences_raw"]).column(0)
                for row, value in enumerate(column.to_pylist()):
                    yield f"{stem}-{group}-{row}", _captions(value)

    def read(self, keys: list[str]) -> Reading:
        groups: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for key in keys:
            stem, group, row = key.rsplit("-", 2)
            groups.setdefault((stem, int(group)), []).append((int(row), key))
        for (stem, group), rows in sorted(groups.items()):
            column = self._open(self.files[stem]).read_row_group(group, columns=["image"]).column(0)
            for row, key in sorted(rows):
                data, suffix = _coco_image(column[row].as_py())
                yield key, data, suffix


def _coco_image(value: Any) -> tuple[bytes | None, str]:
    path = ""
    if isinstance(value, dict):
        value, path = value.get("bytes"), value.get("path") or ""
    data = value if isinstance(value, bytes) and value else None
    suffix = PurePosixPath(path).suffix if path else ""
    return data, suffix or (".png" if data and data.startswith(PNG_MAGIC) else ".jpg")


class FolderSource:
    def __init__(self, folder: Path):
        self.folder = folder

    def entries(self) -> Listing:
        images = sorted((p.relative_to(self.folder).as_posix(), p) for p in self.folder.rglob("*")
                        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        for key, path in images:
            yield key, self._sidecar(path.with_suffix(".txt"))

    def _sidecar(self, path: Path) -> tuple[str, ...]:
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except (FileNotFoundError, IsADirectoryError):
            return ()
        except UnicodeDecodeError:
            raise CorpusError(f"The caption file {path} is not UTF-8 text; save it as UTF-8 and run again.") from None
        return _captions(text.splitlines())

    def read(self, keys: list[str]) -> Reading:
        for key in sorted(keys):
            try:
                data = (self.folder / key).read_bytes()
            except OSError:
                data = None
            yield key, data, PurePosixPath(key).suffix


PRESET_SOURCES = {"flickr30k": FlickrSource, "coco_captions": CocoSource}


def build_sources(project: ProjectFolder, material: Callable[[str], Path]) -> dict[str, ImageSource]:
    """Source name -> source: the presets in their configured order, then the folders.

    A preset whose material is missing raises the pack's UsageError (how to download it)."""
    c = project.settings.corpus
    sources: dict[str, ImageSource] = {}
    for preset in c.image_presets:
        sources[preset] = PRESET_SOURCES[preset](material(f"images_{preset}"))
    for text in c.image_folders:
        folder = project.resolve_user_path(text)
        if not folder.is_dir():
            raise CorpusError(f"The image folder {folder} (corpus.image_folders) does not exist or is not a "
                              f"folder; fix the path in the corpus settings.")
        name = base = safe_name(folder.name, "folder")
        n = 1
        while name in sources:      # two folders of the same name keep separate image names
            n += 1
            name = f"{base}_{n}"
        sources[name] = FolderSource(folder)
    return sources
