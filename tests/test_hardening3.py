"""The third hardening pass (issue 55), items 3-5: over-long paths on the command line, the kind of every path the
layout check covers, and the exit code of clean sentences (2: bad input). Items 1-2 (shards that are not what
their manifest says, missing shards named) are in tests/test_hardening2.py."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import demo_cache
from conftest import cli, cli_here
from test_hardening2 import one_sentence, tree
from trainer_core.project import Project

PACK = "qwen3_zimage"


@pytest.fixture
def trained(tmp_path):
    return demo_cache.copy_trained(PACK, tmp_path / "p")


@pytest.mark.parametrize("command", ["new", "demo", "status", "run", "start"])
def test_a_project_path_the_filesystem_cannot_hold_is_one_sentence(tmp_path, command):
    name_too_long = tmp_path / ("a" * 300)
    path_too_long = Path(str(tmp_path) + "/" + "/".join(["b" * 200] * 21))        # ~4,300 bytes, each name fits
    for project, words in ((name_too_long, "has a name of 300 bytes"), (path_too_long, "is a path of")):
        extra = ["--pack", PACK] if command in ("new", "demo") else []
        r = cli_here(command, "--project", str(project), *extra)
        assert r.returncode == 2
        one_sentence(r, "--project", words, "choose a shorter")
    assert list(tmp_path.iterdir()) == []                                          # nothing created


def test_a_contract_that_is_a_folder_and_a_dangling_data_link_are_named(trained):
    contract = trained / "shards" / "train" / "CONTRACT"
    contract.unlink()
    contract.mkdir()
    r = cli("run", "--project", str(trained))
    assert r.returncode == 2
    one_sentence(r, f"{contract} is a folder where gguf-trainer keeps the train shards' contract")
    status = cli_here("status", "--project", str(trained))
    assert status.returncode == 0 and "Traceback" not in status.stdout + status.stderr
    contract.rmdir()

    shutil.rmtree(trained / "data")
    (trained / "data").symlink_to(trained / "nowhere")
    before = tree(trained)
    r = cli("run", "--project", str(trained))
    assert r.returncode == 2
    one_sentence(r, f"{trained / 'data'}, where gguf-trainer keeps the corpus, is a link to", "does not exist")
    assert (trained / "data").is_symlink() and not (trained / "nowhere").exists()
    assert {k: v for k, v in tree(trained).items() if k != "pipeline.log"} == \
        {k: v for k, v in before.items() if k != "pipeline.log"}            # refused before anything was written


def test_missing_and_damaged_checkpoints_are_bad_input_with_what_to_use(trained, tmp_path):
    r = cli_here("snapshot", "--project", str(trained), "--checkpoint", "step999999")
    assert r.returncode == 2
    one_sentence(r, "There is no kept step step999999")
    fresh = tmp_path / "fresh"
    assert cli_here("new", "--project", str(fresh), "--pack", PACK).returncode == 0
    r = cli_here("snapshot", "--project", str(fresh))
    assert r.returncode == 2
    one_sentence(r, "There is no checkpoint yet")

    best = trained / "checkpoints" / "best.pt"
    os.truncate(best, best.stat().st_size // 2)
    r = cli("run", "--project", str(trained), "--only", "export", "--force")
    assert r.returncode == 2
    out = one_sentence(r, f"The checkpoint {best} is damaged", "--checkpoint last")
    assert "PytorchStreamReader" not in out and "miniz" not in out

    shutil.rmtree(trained / "checkpoints")
    (trained / "checkpoints").write_text("not a folder")
    r = cli_here("snapshot", "--project", str(trained))
    assert r.returncode == 2
    out = one_sentence(r, f"{trained / 'checkpoints'} is a file where gguf-trainer keeps the checkpoints")
    assert "no checkpoint yet" not in out


def test_a_deleted_prompt_file_is_bad_input(trained, tmp_path):
    prompts = {name: tmp_path / f"{name}.txt" for name in ("train", "val")}
    for name, path in prompts.items():
        path.write_text("".join(f"a {name} prompt number {i}\n" for i in range(40)))
    assert cli_here("set", "--project", str(trained), "--set", "corpus.mode=files",
                    "--set", f"corpus.train_file={prompts['train']}",
                    "--set", f"corpus.val_file={prompts['val']}").returncode == 0
    prompts["train"].unlink()
    r = cli("run", "--project", str(trained))
    assert r.returncode == 2
    one_sentence(r, f"The prompt file {prompts['train']} (corpus.train_file) does not exist")
    assert Project.open(trained).gguf_path().exists()                  # the earlier export is left as it was


def test_a_failed_forced_export_is_shown_failed_with_the_export_still_on_disk(trained):
    """Item 7: the forced rerun of export failed while the earlier export still stands (newer than best.pt)."""
    import json
    best = trained / "checkpoints" / "best.pt"
    st = best.stat()
    os.truncate(best, st.st_size // 2)
    os.utime(best, ns=(st.st_atime_ns, st.st_mtime_ns))             # its date as before: the export looks current
    gguf = Project.open(trained).gguf_path()
    r = cli("run", "--project", str(trained), "--only", "export", "--force")
    assert r.returncode == 2 and gguf.is_file()
    report = json.loads(cli_here("status", "--project", str(trained), "--json").stdout)
    row = {s["name"]: s for s in report["stages"]}["export"]
    assert row["done"] and row["status"] == "failed", row
    assert row["kept"] == f"the previous export {gguf.name} is still on disk" and "is damaged" in row["error"]
    out = cli_here("status", "--project", str(trained)).stdout
    line = next(x for x in out.splitlines() if x.strip().startswith("export"))
    assert "failed" in line and gguf.name in line and "{" not in out       # a table, not a JSON dict (issue 56)


@pytest.mark.parametrize("assignment,words", [
    ("train.depth=100000", ["train.depth=100000 with train.width=", "cannot train on this machine", "fits"]),
    ("train.device=cuda:64", ["train.device=cuda:64 names a card this machine does not have", "use auto or cpu"]),
])
def test_set_refuses_a_value_this_machine_cannot_run(trained, assignment, words):
    """Item 6: refused at `set`, one sentence, exit 2, project.json as it was (the plan's own RAM rule gives the
    deepest train.depth that fits; the cards are the ones nvidia-smi lists, none here)."""
    before = (trained / "project.json").read_bytes()
    r = cli_here("set", "--project", str(trained), "--set", assignment)
    assert r.returncode == 2
    one_sentence(r, *words)
    assert (trained / "project.json").read_bytes() == before
    assert cli_here("set", "--project", str(trained), "--set", "train.depth=3").returncode == 0     # one that runs


def test_set_warns_of_a_prompt_file_that_is_not_there_yet(trained):
    """Item 6, extra_files: a file the user may still be writing is a warning at `set` (saved); the corpus stage
    refuses it with one sentence, exit 2, if it is still missing (test_a_deleted_prompt_file_is_bad_input)."""
    r = cli_here("set", "--project", str(trained), "--set", "corpus.extra_files=nowhere/prompts.txt")
    assert r.returncode == 0
    assert f"warning: corpus.extra_files names {trained / 'nowhere' / 'prompts.txt'}, which does not exist (yet)" \
        in r.stdout
    assert Project.open(trained).settings.corpus.extra_files == ["nowhere/prompts.txt"]
