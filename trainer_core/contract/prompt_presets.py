"""The public prompt datasets the text corpus can mix in (`corpus.presets`).

Each preset is read from the Hugging Face Hub in its own way: the small ones with
`datasets.load_dataset(..., split="train")` (cached by datasets, so a rerun reads the disk),
VidProM (1.6 M rows) streamed, DiffusionDB's metadata as one parquet file with pyarrow. The
prompt column is the preset's; when a dataset lacks it, its first column is used. Empty values
are skipped. The Hub address is HF_ENDPOINT; the caller passes the token (base/token_store.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

__all__ = ["PromptPreset", "PRESETS", "read_preset"]


@dataclass(frozen=True)
class PromptPreset:
    id: str
    repo: str
    column: str
    title: str
    how: str = "datasets"          # "datasets" | "stream" | "parquet_file"
    filename: str = ""             # for "parquet_file"


PRESETS: dict[str, PromptPreset] = {p.id: p for p in (
    PromptPreset("gustavosta", "Gustavosta/Stable-Diffusion-Prompts", "Prompt", "Stable Diffusion prompts, ~80k"),
    PromptPreset("midjourney", "succinctly/midjourney-prompts", "text", "Midjourney prompts, ~250k"),
    PromptPreset("diffusiondb", "poloclub/diffusiondb", "prompt", "DiffusionDB metadata, ~1.5M unique",
                 how="parquet_file", filename="metadata.parquet"),
    PromptPreset("vidprom", "WenhaoWang/VidProM", "prompt", "VidProM, ~1.6M", how="stream"),
)}


def _texts(values) -> Iterator[str]:
    for value in values:
        if value:
            yield str(value)


def read_preset(preset: PromptPreset, token: str | None = None) -> Iterator[str]:
    """The preset's prompts, in the dataset's order (raises when the Hub refuses or is unreachable)."""
    if preset.how == "parquet_file":
        import pyarrow.parquet as pq
        from huggingface_hub import hf_hub_download
        path = hf_hub_download(preset.repo, preset.filename, repo_type="dataset", token=token)
        table = pq.read_table(path)
        column = preset.column if preset.column in table.column_names else table.column_names[0]
        yield from _texts(table.column(column).to_pylist())
        return
    from datasets import load_dataset
    ds = load_dataset(preset.repo, split="train", token=token, streaming=preset.how == "stream")
    names = list(ds.column_names or []) if ds.column_names is not None else []
    column = preset.column if (not names or preset.column in names) else names[0]
    if preset.how == "stream":
        yield from _texts(row.get(column) for row in ds)
    else:
        yield from _texts(ds[column])
