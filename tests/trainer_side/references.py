"""The reference-image side of the engine check: a vision tower the engine can run, and the trainer's prediction
for a prompt with a reference image, for every pack whose conditioner reads references (`EngineFacts.references`).

The engine fixes its towers' heads at 16 (llm.hpp:79, ming_image_te.hpp:121; each head_dim = hidden / 16, and
the 2-D rope needs head_dim a multiple of 4, rope.hpp:204-206), while the demo teachers' towers have 2 heads
of 16: the engine cannot run the demos' towers. The check therefore builds its own (16 heads of 4, random
weights, the adapter's vis_dim as its output width) and runs both sides on it; the adapter does not care
which tower made its vision rows, only their width. The tower runs in float32 with the weights as the
engine's file holds them and the patch embedding's input rounded to float16, as the engine's Conv3d computes
it (ggml_extend.hpp:3836, gk_ops.c:1523-1524).

Three families, chosen by what the pack declares:
* `references="mmproj"`, the student reads the template (`raw_prompt` False): the Qwen3-VL contract
  (`pack._data()`: preprocess, build_sample) with the adapter's frozen vision_proj rows spliced into the
  student at the slots (MageFlow; `reference_area`: rendered at the reference's own area, one reference
  carrying an alpha channel, Qwen-Image 2.1);
* `references="mmproj"` with `raw_prompt`: the rows go to the adapter's slots, which the pack's
  prompt_inputs place (the Qwen3.5 bridge, on each of its versions);
* `references="vision_gguf"`: the pack's own tower and vision GGUF (Ming).
The mmproj towers are the vision model of the pack's own teacher (the model type in its config.json), written
as a llama.cpp mmproj (the names a stock mmproj has).
"""
from __future__ import annotations

import importlib

from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainer_core.packs.lookup import resolve_material

__all__ = ["PROMPTS", "SEED", "References", "references_for", "reference_images", "jsonable"]

PROMPTS = ("", "make it snowy", "replace the (red:1.3) ball with a blue cube, keep the background")
SEED = 20261205
TOWER = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 16, "patch_size": 16,
         "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 2304,
         "deepstack_visual_indexes": []}


def reference_images(project_dir: Path, folder: str | None) -> list[Path]:
    """The references of the image check: the files in `folder`, else the demo's own scenes."""
    where = Path(folder) if folder else project_dir / "materials" / "demo_images"
    return sorted(p for p in where.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))


def jsonable(ids: list) -> list:
    """Ids as the fixture keeps them (an image run as ["patch", n])."""
    return [list(i) if isinstance(i, tuple) else i for i in ids]


def image_size(path: Path) -> tuple[int, int]:
    from PIL import Image
    with Image.open(path) as img:
        return img.size


def with_alpha(path: Path, out: Path) -> Path:
    """The reference with a transparent left third and a half-transparent band: the alpha the Qwen-Image 2.1
    conditioner composites over white (conditioner.hpp:3101-3106), the colours under it kept."""
    from PIL import Image
    with Image.open(path) as img:
        rgba = np.asarray(img.convert("RGBA")).copy()
    w = rgba.shape[1]
    rgba[:, : w // 3, 3] = 0
    rgba[:, w // 3: w // 2, 3] = 128
    Image.fromarray(rgba, "RGBA").save(out)
    return out


class References:
    """One model version's references (in PROMPTS order), the tower both sides run, and the trainer's side of a
    prompt with one of them. `request(ref)`: what the engine request carries besides the text and the pixels."""

    def __init__(self, ours: Any, version: str, images: list[Path], work: Path) -> None:
        self.ours, self.version, self.work = ours, version, work
        work.mkdir(parents=True, exist_ok=True)
        self.tower = self.build_tower()
        images = images[:len(PROMPTS)]
        self.refs = [images[i % len(images)] for i in range(len(PROMPTS))] if images else []

    def build_tower(self) -> Any:
        raise NotImplementedError

    def tower_file(self) -> Path:
        """The tower as the engine's --llm_vision file (written here, under the work folder)."""
        raise NotImplementedError

    def request(self, ref: Path) -> dict[str, Any]:
        return {}

    def predict(self, text: str, ref: Path) -> dict[str, Any]:
        """{"hidden", "rows", "vis", "ids", "slots", "pixels"} and where the engine's ids are ("ids_file", a dump
        file, or "ids_log", the line its conditioner logs)."""
        raise NotImplementedError


class _QwenTower(References):
    """A seeded random vision tower of the teacher's own model type (Qwen3-VL's, Qwen3.5's), written as an mmproj."""

    def build_tower(self) -> Any:
        """Every weight drawn (norm scales around 1), so a swapped or misnamed tensor shows in the rows."""
        import json

        import torch
        from transformers import AutoConfig, AutoModel
        model_type = json.loads((resolve_material(self.ours.project, "teacher") / "config.json").read_text())["model_type"]
        config = AutoConfig.for_model(model_type, vision_config={**TOWER, "out_hidden_size": self.ours.adapter.config.vis_dim})
        gen = torch.Generator().manual_seed(SEED)
        model = AutoModel.from_config(config.vision_config).float().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=gen)
                if "norm" in name and name.endswith("weight"):
                    p.copy_(1.0 + 0.1 * noise)
                elif p.ndim >= 2:
                    p.copy_(noise / float(np.sqrt(np.prod(p.shape[1:]))))
                else:
                    p.copy_(0.1 * noise)
        return model

    def tower_file(self) -> Path:
        import gguf
        path = self.work / "tower-mmproj.gguf"
        writer = gguf.GGUFWriter(str(path), "clip")
        writer.add_string("clip.projector_type", "qwen3vl_merger")
        writer.add_bool("clip.has_vision_encoder", True)
        for name, value in mmproj_tensors(self.tower).items():
            writer.add_tensor(name, value.astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    def tower_rows(self, image: np.ndarray) -> np.ndarray:
        """The merger's rows [n, vis_dim] float32 of one preprocessed [h, w, 3] image, the patch embedding in
        float16 operands (pixels and weights) as the engine computes it."""
        import torch
        from trainer_core.packs.common.qwen3vl.vision_data import patchify
        rows, grid = patchify(image)
        pixels = torch.from_numpy(rows).half().float()
        proj = self.tower.patch_embed.proj
        kept = proj.weight.detach().clone()
        try:
            with torch.no_grad():
                proj.weight.copy_(kept.half().float())
                out = self.tower(hidden_states=pixels, grid_thw=torch.tensor([grid]))
        finally:
            with torch.no_grad():
                proj.weight.copy_(kept)
        return out.pooler_output.float().numpy()


def mmproj_tensors(tower: Any) -> dict[str, np.ndarray]:
    """The tower's tensors under llama.cpp's mmproj names (the engine converts them back,
    name_conversion.cpp:186-224): the Conv3d patch embedding split over its two temporal taps."""
    state = {k: v.detach().float().numpy() for k, v in tower.state_dict().items()}
    out = {"v.patch_embd.weight": state.pop("patch_embed.proj.weight")}
    out["v.patch_embd.weight.1"] = out["v.patch_embd.weight"][:, :, 1]
    out["v.patch_embd.weight"] = out["v.patch_embd.weight"][:, :, 0]
    renames = (("patch_embed.proj.bias", "v.patch_embd.bias"), ("pos_embed.weight", "v.position_embd.weight"),
               ("merger.norm.", "v.post_ln."), ("merger.linear_fc1.", "mm.0."), ("merger.linear_fc2.", "mm.2."),
               ("blocks.", "v.blk."), (".attn.qkv.", ".attn_qkv."), (".attn.proj.", ".attn_out."),
               (".mlp.linear_fc1.", ".ffn_up."), (".mlp.linear_fc2.", ".ffn_down."), (".norm1.", ".ln1."),
               (".norm2.", ".ln2."))
    for name, value in state.items():
        for old, new in renames:
            name = name.replace(old, new)
        out[name] = np.ascontiguousarray(value)
    return out


class SplicedReferences(_QwenTower):
    """The Qwen3-VL contract (`pack._data()`, what precompute reads): the pack's preprocessing, template and
    slots, the adapter's frozen vision_proj rows spliced into the student's input, the kind's infer."""

    def __init__(self, ours: Any, version: str, images: list[Path], work: Path) -> None:
        self.area = ours.pack.engine.reference_area
        if self.area:
            # the pipeline first resizes a reference to the request's area (gk-diffuser.cpp:6016-6071, not linked
            # here): the request is the reference's own size, a multiple of 32 a side, so that resize keeps it
            images = [p for p in images if image_size(p)[0] % 32 == 0 and image_size(p)[1] % 32 == 0]
            work.mkdir(parents=True, exist_ok=True)
            images = [*images[:1], with_alpha(images[0], work / "alpha.png"), *images[1:2]] if images else []
        super().__init__(ours, version, images, work)

    def request(self, ref: Path) -> dict[str, Any]:
        if not self.area:
            return {}
        w, h = image_size(ref)
        return {"width": w, "height": h}

    def predict(self, text: str, ref: Path) -> dict[str, Any]:
        import torch
        from trainer_core.infer import run_adapter
        ours, data = self.ours, self.ours.pack._data()
        w, h = image_size(ref)
        pixels = [data.preprocess(ref, w * h) if self.area else data.preprocess(ref)]
        raw = [self.tower_rows(im) for im in pixels]
        sample = data.build_sample(ours.student.tokenizer, text, [r.shape[0] for r in raw])
        weight = ours.adapter.model.vision_proj.weight.detach().float()              # [in_dim, vis_dim]
        model = ours.student.model
        with torch.no_grad():
            x = model.embed_tokens(torch.tensor([sample.ids]))
            for (start, n), rows in zip(sample.slots, raw):
                x[0, start:start + n] = torch.from_numpy(rows) @ weight.T
            hidden = model(inputs_embeds=x, use_cache=False).last_hidden_state[0].float().numpy()
        dense = np.zeros((len(sample.ids), raw[0].shape[1]), np.float32)
        for (start, n), rows in zip(sample.slots, raw):
            dense[start:start + n] = rows
        out = run_adapter(ours.adapter, hidden, vis=dense)
        return {"hidden": hidden, "rows": out, "ids": sample.ids, "ids_file": "tokens.txt",
                "vis": np.concatenate(raw), "slots": [list(s) for s in sample.slots], "pixels": pixels}


class SlotReferences(_QwenTower):
    """A raw-prompt pack's references at the adapter's slots: the reference as its precompute reads it, the student
    on the raw prompt, the seed ids and the references' slot runs from prompt_inputs, the kind's infer with the
    raw rows (on a version that reads the bank head, the bank)."""

    def predict(self, text: str, ref: Path) -> dict[str, Any]:
        from trainer_core.infer import run_adapter
        ours = self.ours
        pixels = [slot_reference_reader(ours.pack)(ref)]
        vis = np.concatenate([self.tower_rows(im) for im in pixels])
        hidden = ours.pack.student_states(ours.student, text)
        derived = ours.pack.prompt_inputs(ours.project, ours.adapter_path, text, vis)
        out = run_adapter(ours.adapter, hidden, vis=vis, seed_ids=derived["--seed-ids"], vis_pos=derived["--vis-pos"],
                          bank=self.version in ours.pack.engine.bank_versions, empty_prompt=text == "")
        return {"hidden": hidden, "rows": out, "ids": list(derived["--seed-ids"]), "ids_file": "seed_ids.txt",
                "vis": vis, "slots": [list(r) for r in derived["--vis-pos"]], "pixels": pixels}


class OwnTowerReferences(References):
    """The pack's own tower and vision GGUF: a tiny snapshot whose tower has the engine's 16 heads
    (ming_image_te.hpp:119-122; window 112 and full attention only in blocks 7, 15, 23, 31, so none at depth 2),
    the file its export writes, the reference as its precompute reads it, the tower's unit rows, the student on
    the raw prompt, the template's ids and the image run from prompt_inputs, the kind's infer. The weights are
    rounded as the GGUF stores them (F16 matrices, the BF16 patch embedding) and the patch embedding's input to
    float16, as the engine computes it. The conditioner logs the ids it feeds, the image run collapsed."""

    def build_tower(self) -> Any:
        import torch
        parts = own_tower_parts(self.ours.pack)
        self.root = parts.write_tiny(self.work / "own-tower", hidden=self.ours.adapter.config.vis_dim,
                                     seed=SEED % 1000, vision={"hidden_size": 64, "intermediate_size": 128,
                                                               "num_heads": 16, "fullatt_block_indexes": []})
        tower = parts.load_tower(self.root)
        with torch.no_grad():
            for p in tower.parameters():
                if p.ndim >= 2:
                    p.copy_(p.half().float())
        return tower

    def tower_file(self) -> Path:
        path = self.work / "own-vision-f16.gguf"
        own_tower_parts(self.ours.pack).export(self.root, path, force=True)
        return path

    def predict(self, text: str, ref: Path) -> dict[str, Any]:
        import torch
        from trainer_core.infer import run_adapter
        ours, parts = self.ours, own_tower_parts(self.ours.pack)
        pixels = [parts.read_reference(ref)]
        patches, grid = parts.patchify(pixels[0])
        vis = self.tower.encode(torch.from_numpy(patches).half().float(), [grid]).numpy()
        hidden = ours.pack.student_states(ours.student, text)
        derived = ours.pack.prompt_inputs(ours.project, ours.adapter_path, text, vis)
        out = run_adapter(ours.adapter, hidden, vis=vis, seed_ids=derived["--seed-ids"], vis_pos=derived["--vis-pos"],
                          bank=self.version in ours.pack.engine.bank_versions, empty_prompt=text == "")
        ids = list(derived["--seed-ids"])
        (start, n), = derived["--vis-pos"]
        assert len(set(ids[start:start + n])) == 1, "the image run holds one patch id"
        return {"hidden": hidden, "rows": out, "ids": [*ids[:start], ("patch", n), *ids[start + n:]],
                "ids_log": "adapter slots", "vis": vis, "slots": None, "pixels": pixels}


def references_for(ours: Any, version: str, images: list[Path], work: Path) -> References | str:
    """`version`'s references for the pack of `ours`, by what it declares (a sentence when none suits)."""
    facts = ours.pack.engine
    family = {"mmproj": SlotReferences if facts.raw_prompt else SplicedReferences,
              "vision_gguf": OwnTowerReferences}.get(facts.references)
    if family is None:
        return f"{version}: the pack declares no reference path the check knows ({facts.references!r})"
    if not images:
        return f"{version}: no reference images"
    refs = family(ours, version, images, work)
    return refs if refs.refs else f"{version}: no reference whose sides are multiples of 32"


# ------------------------------------------------------------ what a pack declares of its references
def slot_reference_reader(pack: Any) -> Callable[[Path], np.ndarray]:
    """The reader a raw-prompt pack's precompute reads a reference with (EngineFacts.reference_reader)."""
    module, _, name = pack.engine.reference_reader.partition(":")
    return getattr(importlib.import_module(module), name)


def own_tower_parts(pack: Any) -> Any:
    """The pack's own tower (EngineFacts.vision_tower): its tiny writer, loader, export, reader and patchify."""
    return importlib.import_module(pack.engine.vision_tower)
