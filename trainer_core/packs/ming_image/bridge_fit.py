"""Fit the adapter's `vis_bridge` (vis_bridge.py): a stock Qwen2.5-VL mmproj's rows → the Ling vision
rows the adapter was trained on, so `--llm_vision mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf` can stand in
for pig_ming_vision when editing.

* **When.** In the export stage, when the `stock_mmproj` material is picked and `export.vis_bridge` is
  on; the fit is kept in `<project>/vis_bridge.pt` with the key it was made from (the mmproj's resolved
  path, size and mtime, the settings below, the train shards' names and sizes), so a later export or
  snapshot reuses it and a changed input fits it again.
* **Data.** The input images of the train shards (`meta.images`, first image of a sample), at most
  `export.vis_bridge_images`: their Ling rows from `v_pack`, their stock rows from the mmproj's tower
  over the same pixels (template.preprocess_image: the engine preprocesses the reference the Ming way
  for either tower). One image in ten (at least one when there are two) is held out for the
  reported cosine.
* **Fit.** One image a step (the engine runs one at a time, grids vary), loss 1 − mean row cosine
  (both sides are unit rows), AdamW with a 5% warm-up and a cosine decay, `export.vis_bridge_steps`
  steps of width `export.vis_bridge_width`, depth `export.vis_bridge_depth`, seeded by `train.seed`.
"""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer_core.base.atomic import atomic_path, atomic_write_json
from trainer_core.base.errors import TrainerError
from trainer_core.contract.vis_bridge import BridgeConfig, VisBridge
from trainer_core.packs.lookup import require_material, resolve_material

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = ["FILE", "KEY_FILE", "fit_key", "fitted_bridge", "bridge_stale", "ensure_vis_bridge", "fit_bridge",
           "bridge_pairs"]

FILE = "vis_bridge.pt"
KEY_FILE = "vis_bridge.json"          # the key of vis_bridge.pt, cheap to compare (the export stage's staleness)
Pair = tuple[torch.Tensor, torch.Tensor, int, int]          # stock rows, Ling rows, grid_h, grid_w


def _mmproj(project: "ProjectFolder") -> Path | None:
    return resolve_material(project, "stock_mmproj")


def fit_key(project: "ProjectFolder", mmproj: Path) -> dict[str, Any]:
    from trainer_core.contract.shards import valid_shards
    e, stat = project.settings.export, mmproj.stat()
    where = mmproj.resolve()
    try:                          # inside the project folder: by its place there, so a moved project keeps its fit
        where = where.relative_to(project.root.resolve())
    except ValueError:
        pass
    return {"mmproj": str(where), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "steps": e.vis_bridge_steps, "width": e.vis_bridge_width, "depth": e.vis_bridge_depth,
            "images": e.vis_bridge_images, "seed": project.settings.train.seed,
            "shards": [[p.name, p.stat().st_size] for p in valid_shards(project, "train")]}


def bridge_stale(project: "ProjectFolder") -> bool:
    """Whether the export has a bridge to (re)fit or to write: one is wanted, and vis_bridge.json does not
    hold this key or the adapter GGUF is older than the fit. Reads no tensor."""
    from trainer_core.base.atomic import read_json
    mmproj = _mmproj(project)
    if not project.settings.export.vis_bridge or mmproj is None or not mmproj.is_file():
        return False
    saved = read_json(project.root / KEY_FILE, None)
    if not isinstance(saved, dict) or saved.get("key") != fit_key(project, mmproj):
        return True
    fit, gguf = project.root / FILE, project.gguf_path()
    return not fit.is_file() or not gguf.is_file() or gguf.stat().st_mtime_ns < fit.stat().st_mtime_ns


def fitted_bridge(project: "ProjectFolder") -> tuple[VisBridge, dict[str, Any]] | None:
    """The fitted bridge when export.vis_bridge is on, a stock mmproj is picked and vis_bridge.pt was fitted
    from exactly these inputs; else None."""
    mmproj = _mmproj(project)
    path = project.root / FILE
    if not project.settings.export.vis_bridge or mmproj is None or not mmproj.is_file() or not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved["key"] != fit_key(project, mmproj):
            return None
        model = VisBridge(BridgeConfig(**saved["config"]))
        model.load_state_dict(saved["state"])
    except Exception:  # noqa: BLE001 - a damaged or older file is fitted again
        return None
    return model.eval(), saved


def bridge_pairs(project: "ProjectFolder", stock: Any, limit: int, should_stop: Callable[[], bool] = lambda: False,
                 progress: Callable[[int, int], None] = lambda done, total: None) -> list[Pair] | None:
    """(stock rows, Ling rows, grid) of up to `limit` input images of the train shards; None when stopped."""
    from trainer_core.contract.shards import Shard, valid_shards
    from trainer_core.packs.ming_image.template import FACTOR, patchify, preprocess_image
    wanted: list[tuple[Path, torch.Tensor]] = []
    for path in valid_shards(project, "train"):
        shard = Shard(path)
        if "v_pack" not in shard.keys:
            continue
        rows, images = shard["v_pack"], shard.meta.get("images") or []
        offset = 0
        for sample, count in zip(shard["vis_sample"].tolist(), shard["vis_len"].tolist()):
            if len(wanted) < limit and sample < len(images) and images[sample]:
                wanted.append((project.data_dir / images[sample][0], rows[offset:offset + count].float()))
            offset += count
        if len(wanted) >= limit:
            break
    pairs: list[Pair] = []
    for i, (image_path, ling) in enumerate(wanted):
        if should_stop():
            return None
        try:
            image = preprocess_image(image_path)
        except (OSError, ValueError) as e:
            raise TrainerError(f"The input image {image_path} cannot be read ({e}); reset the corpus so it is "
                               "built again without it.") from None
        patches, grid = patchify(image)
        gh, gw = image.shape[0] // FACTOR, image.shape[1] // FACTOR
        x = stock.encode(torch.from_numpy(patches), [grid]).to("cpu", torch.bfloat16)
        if x.shape[0] != ling.shape[0]:
            raise TrainerError(f"The stock mmproj gives {x.shape[0]} rows for {image_path} where the Ling tower "
                               f"gave {ling.shape[0]}; pick a Qwen2.5-VL mmproj (patch 14, merge 2).")
        pairs.append((x, ling.to(torch.bfloat16), gh, gw))
        progress(i + 1, len(wanted))
    return pairs


def _cos(model: VisBridge, pairs: list[Pair], device: torch.device) -> float:
    with torch.no_grad():
        values = [torch.nn.functional.cosine_similarity(model(x.to(device).float(), gh, gw),
                                                        y.to(device).float(), dim=-1).mean().item()
                  for x, y, gh, gw in pairs]
    return sum(values) / len(values)


def fit_bridge(pairs: list[Pair], config: BridgeConfig, steps: int, seed: int, device: torch.device,
               should_stop: Callable[[], bool] = lambda: False,
               progress: Callable[[int, float], None] = lambda step, loss: None, lr: float = 1e-3
               ) -> tuple[VisBridge, float, int] | None:
    """The bridge fitted on `pairs` (one image a step); (model, held-out cos, held-out images), None when
    stopped."""
    torch.manual_seed(seed)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, len(pairs) // 10) if len(pairs) >= 2 else 0
    val, train = [pairs[i] for i in order[:n_val]], [pairs[i] for i in order[n_val:]]
    model = VisBridge(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    rng = random.Random(seed + 1)
    for step in range(1, steps + 1):
        if should_stop():
            return None
        x, y, gh, gw = train[rng.randrange(len(train))]
        out = model(x.to(device).float(), gh, gw)
        loss = 1 - torch.nn.functional.cosine_similarity(out, y.to(device).float(), dim=-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        progress(step, float(loss))
    model.eval()
    return model, _cos(model, val or train, device), len(val)


def ensure_vis_bridge(project: "ProjectFolder", report: Any, should_stop: Callable[[], bool]) -> bool:
    """Fit vis_bridge.pt when it is wanted and stale (see the module docstring); False when stopped."""
    from trainer_core.contract.devices import pick_device
    from trainer_core.packs.ming_image.stock_vision import StockVision
    e = project.settings.export
    mmproj = _mmproj(project)
    if not e.vis_bridge or mmproj is None:
        return True
    mmproj = require_material(project, "stock_mmproj")
    if fitted_bridge(project) is not None:
        report("log", level="info", message=f"{FILE} is up to date (fitted on {mmproj.name})")
        return True
    device = pick_device(project.settings.train.device)
    report("log", level="info", message=f"fitting the vis_bridge for {mmproj.name} on {device} "
                                        f"({e.vis_bridge_steps} steps, width {e.vis_bridge_width})")
    stock = StockVision.load(mmproj, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    pairs = bridge_pairs(project, stock, e.vis_bridge_images, should_stop,
                         lambda done, total: report("progress", count=done, total=total, unit="images"))
    del stock
    if pairs is None:
        return False
    if not pairs:
        report("log", level="warning", message="the vis_bridge was not fitted: the train shards hold no input "
                                               "images (corpus.n_image = 0)")
        return True
    vis_dim = int(pairs[0][1].shape[1])
    config = BridgeConfig(in_dim=int(pairs[0][0].shape[1]), out_dim=vis_dim, width=e.vis_bridge_width,
                          depth=e.vis_bridge_depth, mlp_hidden=4 * e.vis_bridge_width)
    every, log_every = max(1, e.vis_bridge_steps // 50), max(1, e.vis_bridge_steps // 10)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == e.vis_bridge_steps:
            report("progress", count=step, total=e.vis_bridge_steps, unit="steps")
        if step % log_every == 0 or step == e.vis_bridge_steps:
            report("log", level="info", message=f"vis_bridge step {step}/{e.vis_bridge_steps} loss {loss:.5f}")

    fitted = fit_bridge(pairs, config, e.vis_bridge_steps, project.settings.train.seed, device, should_stop,
                        progress)
    if fitted is None:
        return False
    model, cos, held_out = fitted
    saved = {"config": {"in_dim": config.in_dim, "out_dim": config.out_dim, "width": config.width,
                        "depth": config.depth, "mlp_hidden": config.mlp_hidden},
             "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "key": fit_key(project, mmproj), "val_cos": cos, "held_out": held_out, "images": len(pairs)}
    with atomic_path(project.root / FILE) as tmp:
        torch.save(saved, tmp)
    atomic_write_json(project.root / KEY_FILE, {"key": saved["key"], "val_cos": cos, "images": len(pairs)})
    report("log", level="info", message=f"vis_bridge fitted on {len(pairs) - held_out} images: cos {cos:.5f} on "
                                        f"{held_out or len(pairs)} {'held-out' if held_out else 'training'} image(s); "
                                        f"the adapter carries it, so `--llm_vision {mmproj}` can replace "
                                        "pig_ming_vision for editing")
    return True
