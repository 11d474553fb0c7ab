"""Settings layer: count parsing, defaults, pack overlays, validation, key=value assignments.

Expected values are written out literally from the reference table (peer-behaviour §2.1)
and the packs contract, never computed by the code under test.
"""
from __future__ import annotations

import copy
import json
import math

import pytest

from trainer_core.base.config import Settings, pack_settings_of, parse_count
from trainer_core.project import apply_assignments, default_settings_dict, settings_from_dict
from trainer_core.base.errors import ConfigError, UnknownPackError
from trainer_core.packs import PACKS

# ---------------------------------------------------------------- the reference table (§2.1)

REFERENCE = {
    "pack": "llada_image",
    "name": "pig_llada_adapter",
    "auto_resume": True,
    "hf_token": "",
    "materials": {},
    "corpus": {
        "mode": "presets",
        "presets": ["gustavosta", "midjourney"],
        "extra_files": [],
        "train_file": "",
        "val_file": "",
        "n_train": 60000,
        "n_val": 1024,
        "empty_frac": 0.01,
        "min_chars": 8,
        "max_chars": 1200,
        "seed": 8,
        "image_presets": [],
        "image_folders": [],
        "n_image": 56000,
        "n_two": 3000,
        "n_text": 27000,
        "n_val_image": 1024,
        "n_val_text": 512,
    },
    "precompute": {
        "device": "auto",
        "placement": "sequential",
        "shard_size": 1024,
        "val_shard_size": 512,
        "teacher_batch": 24,
        "tok_budget": 12288,
        "student_batch": 64,
        "student_tok_budget": 0,
        "vis_tok_budget": 0,
        "teacher_mode": "auto",
        "gpu_mem_gib": 0,
        "cpu_mem_gib": 0,
        "student_dtype": "bf16",
    },
    "train": {
        "device": "auto",
        "width": 1024,
        "depth": 6,
        "steps": 20000,
        "batch_size": 32,
        "lr": 2e-4,
        "warmup": 1000,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
        "cos_weight": 0.5,
        "sigma_floor": 0.03,
        "grad_checkpoint": "auto",
        "log_every": 25,
        "val_every": 500,
        "save_every": 250,
        "history": False,
        "history_every": 500,
        "history_from": 0,
        "history_to": 0,
        "history_keep": 0,
        "seed": 42,
    },
    "export": {
        "output_dir": "",
        "copy_to": "",
        "export_sigvq": True,
        "run_eval": True,
    },
}

SECTION_NAMES = ("corpus", "precompute", "train", "export")


def _flatten(d: dict) -> dict:
    """{"train": {"steps": 1}} -> {"train.steps": 1}; lists and materials stay as values."""
    out = {}
    for key, value in d.items():
        if key in SECTION_NAMES:
            for sub, v in value.items():
                out[f"{key}.{sub}"] = v
        else:
            out[key] = value
    return out


REFERENCE_FLAT = _flatten(REFERENCE)


def _project(actual: dict, keys) -> dict:
    flat = _flatten(actual)
    missing = [k for k in keys if k not in flat]
    assert not missing, f"settings lack keys of the reference table: {missing}"
    return {k: flat[k] for k in keys}


# ---------------------------------------------------------------- parse_count

@pytest.mark.parametrize(
    "value, expected",
    [
        (12000, 12000),
        ("12000", 12000),
        ("12k", 12000),
        ("12K", 12000),
        ("1.5k", 1500),
        ("40k", 40000),
        ("12,000", 12000),
        ("1,000,000", 1000000),
        ("12_000", 12000),
        (12000.0, 12000),
        ("12000.0", 12000),
        (" 12k ", 12000),
        ("2m", 2000000),
        ("1.5M", 1500000),
        (1, 1),
    ],
)
def test_parse_count_accepts(value, expected):
    result = parse_count(value)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [0, -5, "-5", "0", "1.2345k", "abc", "nan", float("nan"), float("inf"), float("-inf"),
     "", "   ", True, False, None, "1,2", "12,00", "12.5", 12.5, "k", "12__000", "1e3",
     [12000], {"n": 1}],
    ids=repr,
)
def test_parse_count_rejects(value):
    with pytest.raises(ValueError) as info:
        parse_count(value)
    assert "positive whole number" in str(info.value)


def test_parse_count_minimum_zero_accepts_zero():
    assert parse_count(0, minimum=0) == 0
    assert parse_count("0", minimum=0) == 0
    assert parse_count("0k", minimum=0) == 0
    with pytest.raises(ValueError, match="at least 0"):
        parse_count(-1, minimum=0)


def test_parse_count_minimum_is_enforced():
    assert parse_count(64, minimum=64) == 64
    with pytest.raises(ValueError, match="at least 64"):
        parse_count(63, minimum=64)


# ---------------------------------------------------------------- built-in defaults

def test_default_settings_equal_reference_table():
    actual = default_settings_dict("llada_image")
    assert _project(actual, REFERENCE_FLAT) == REFERENCE_FLAT
    # the sections are the table's sections, no more, no fewer
    assert set(actual) == set(REFERENCE)


def test_default_pack_is_llada_image():
    assert default_settings_dict() == default_settings_dict("llada_image")


def test_settings_dataclass_defaults_equal_reference_table():
    """The built-in defaults know no pack: the reference table's pack, name and the settings the default
    pack declares (LLaDA's export.export_sigvq) are the default pack's."""
    from trainer_core.packs import DEFAULT_PACK
    actual = Settings().to_dict()
    assert actual["pack"] == ""
    own = ("pack", "name", *pack_settings_of(PACKS[DEFAULT_PACK]))
    packless = {k: v for k, v in REFERENCE_FLAT.items() if k not in own}
    assert _project(actual, packless) == packless
    assert _project(default_settings_dict(), REFERENCE_FLAT) == REFERENCE_FLAT


def test_empty_dict_loads_as_defaults():
    s = settings_from_dict({})
    assert _project(s.to_dict(), REFERENCE_FLAT) == REFERENCE_FLAT


@pytest.mark.parametrize("key, expected", sorted(REFERENCE_FLAT.items()))
def test_each_default_value(key, expected):
    # one assertion per key so a drift in a single default is named in the report
    flat = _flatten(default_settings_dict("llada_image"))
    assert flat[key] == expected
    if isinstance(expected, bool):
        assert isinstance(flat[key], bool)


def test_default_lists_are_not_shared_between_instances():
    a, b = Settings(), Settings()
    a.corpus.presets.append("vidprom")
    assert b.corpus.presets == ["gustavosta", "midjourney"]
    d = default_settings_dict("qwen3vl_mageflow")
    d["corpus"]["image_presets"].append("coco_captions")
    assert default_settings_dict("qwen3vl_mageflow")["corpus"]["image_presets"] == ["flickr30k"]


def test_unknown_pack_is_refused():
    with pytest.raises(UnknownPackError):
        default_settings_dict("no_such_pack")


# ---------------------------------------------------------------- pack overlays

PACK_OVERLAYS = {
    "qwen3vl_mageflow": {
        "name": "pig_qwen3vl_4b_adapter",
        "train.depth": 4,
        "precompute.shard_size": 512,
        "precompute.val_shard_size": 256,
        "precompute.teacher_batch": 0,
        "precompute.tok_budget": 0,
        "precompute.student_batch": 0,
        "corpus.image_presets": ["flickr30k"],
        "corpus.empty_frac": 0.015,
    },
    "qwen3vl_qwenimage": {
        "name": "pig_qwen3vl_8b_adapter",
        "train.depth": 4,
        "precompute.shard_size": 256,
        "precompute.val_shard_size": 128,
        "corpus.n_image": 30000,
        "corpus.n_two": 2000,
        "corpus.n_text": 40000,
        "corpus.n_val_image": 512,
        "corpus.n_val_text": 512,
    },
    "t5xxl_pixart": {
        "name": "pig_t5_adapter",
        "corpus.n_train": 120000,
        "corpus.n_val": 2048,
        "precompute.teacher_batch": 0,
    },
}

# keys the packs contract as given leaves open for a pack: not compared against the base table
UNSPECIFIED = {
    "qwen3vl_mageflow": set(),
    "qwen3vl_qwenimage": {
        "corpus.image_presets", "corpus.empty_frac", "precompute.teacher_batch",
        "precompute.tok_budget", "precompute.student_batch",
    },
    "t5xxl_pixart": {"precompute.tok_budget", "precompute.student_batch"},
}


@pytest.mark.parametrize("pack_id", sorted(PACK_OVERLAYS))
def test_pack_overlay_over_defaults(pack_id):
    expected = dict(REFERENCE_FLAT)
    expected.update(PACK_OVERLAYS[pack_id])
    expected["pack"] = pack_id
    # a setting another pack declares (LLaDA's export.export_sigvq) is not part of this pack's project
    foreign = {k for p in PACKS.values() for k in pack_settings_of(p)} - set(pack_settings_of(PACKS[pack_id]))
    keys = [k for k in expected if k not in UNSPECIFIED[pack_id] and k not in foreign]
    expected = {k: expected[k] for k in keys}

    raw = default_settings_dict(pack_id)
    assert _project(raw, keys) == expected
    assert not foreign & set(_flatten(raw))

    # the overlay survives validation, and a file naming only its pack gets it at load
    assert _project(settings_from_dict(raw).to_dict(), keys) == expected
    loaded = settings_from_dict({"pack": pack_id}).to_dict()
    assert _project(loaded, keys) == expected


@pytest.mark.parametrize("pack_id, key, value",
                         [(p, k, v) for p, ov in sorted(PACK_OVERLAYS.items()) for k, v in sorted(ov.items())])
def test_each_pack_overlay_value(pack_id, key, value):
    assert _flatten(default_settings_dict(pack_id))[key] == value


def test_loading_deep_merges_over_defaults():
    s = settings_from_dict({"pack": "t5xxl_pixart", "train": {"steps": 500}})
    assert s.pack == "t5xxl_pixart"
    assert s.train.steps == 500
    # every other train default kept
    train = s.to_dict()["train"]
    for key, value in REFERENCE["train"].items():
        if key != "steps":
            assert train[key] == value, key
    # the pack overlay kept
    assert s.corpus.n_train == 120000
    assert s.corpus.n_val == 2048
    assert s.precompute.teacher_batch == 0
    assert "export_sigvq" not in s.to_dict()["export"]        # LLaDA's setting, not part of a PixArt project
    assert s.name == "pig_t5_adapter"
    # the rest of the corpus defaults kept
    assert s.corpus.presets == ["gustavosta", "midjourney"]
    assert s.corpus.max_chars == 1200


def test_loading_does_not_mutate_input():
    raw = {"pack": "t5xxl_pixart", "train": {"steps": "12k"}, "corpus": {"presets": ["vidprom"]}}
    before = copy.deepcopy(raw)
    s = settings_from_dict(raw)
    assert s.train.steps == 12000
    assert raw == before


def test_file_value_overrides_pack_overlay():
    s = settings_from_dict({"pack": "qwen3vl_mageflow", "train": {"depth": 8}, "export": {"run_eval": False}})
    assert s.train.depth == 8
    assert s.export.run_eval is False
    assert s.precompute.shard_size == 512


def test_a_pack_declares_its_own_settings_and_another_packs_are_dropped_on_load_and_refused_when_set():
    """train.max_slots is the Qwen3.5 bridge's and Ming's: a LLaDA project has none. A project.json that
    still holds it (written before the pack changed, or by a version that kept every pack's settings) loads
    without it; setting it is one sentence naming the packs that have it."""
    bridge = settings_from_dict({"pack": "qwen35_bridge", "train": {"max_slots": "1k"}})
    assert bridge.train.max_slots == 1000 and bridge.to_dict()["train"]["max_slots"] == 1000
    assert bridge.train.klein_head is True                        # the pack's declared default
    old = settings_from_dict({"pack": "llada_image", "train": {"max_slots": 2304}, "export": {"export_sigvq": False}})
    assert "max_slots" not in old.to_dict()["train"] and old.export.export_sigvq is False
    with pytest.raises(AttributeError, match="max_slots"):
        old.train.max_slots
    with pytest.raises(ConfigError) as e:
        apply_assignments(old.to_dict(), ["train.max_slots=640"])
    [problem] = e.value.problems
    owners = [p.title for p in PACKS.values() if "train.max_slots" in pack_settings_of(p)]
    assert len(owners) == 2 and problem.startswith("train.max_slots is a setting of the ")
    assert all(title in problem for title in owners)
    assert problem.endswith(f"this project's pack ({PACKS['llada_image'].title}) has none")
    with pytest.raises(ConfigError, match="train.max_slots must be a positive whole number"):
        settings_from_dict({"pack": "ming_image", "train": {"max_slots": "many"}})


# ---------------------------------------------------------------- validation

def test_every_problem_is_reported_at_once():
    raw = {
        "train": {"steps": "abc", "stesp": 5, "lr": "x"},
        "corpus": {"presets": ["x"]},
        "bogus_key": 1,
    }
    with pytest.raises(ConfigError) as info:
        settings_from_dict(raw)
    problems = info.value.problems
    assert len(problems) == 5
    assert 'train.steps must be a positive whole number, got "abc"' in problems
    assert any('"train.stesp" is not a setting' in p and 'did you mean "train.steps"' in p
               for p in problems)
    assert any(p.startswith("train.lr ") and '"x"' in p for p in problems)
    assert any(p.startswith("corpus.presets ") and '["x"]' in p for p in problems)
    assert any('"bogus_key" is not a setting' in p for p in problems)
    text = str(info.value)
    assert text.startswith("5 settings are invalid: ")
    assert 'train.steps must be a positive whole number, got "abc"' in text


def test_single_problem_message_is_the_problem():
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"train": {"steps": "abc"}})
    assert info.value.problems == ['train.steps must be a positive whole number, got "abc"']
    assert str(info.value) == 'train.steps must be a positive whole number, got "abc"'


def test_unknown_top_level_key_gets_hint():
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"nmae": "x"})
    assert info.value.problems == ['"nmae" is not a setting (did you mean "name"?)']


@pytest.mark.parametrize(
    "raw, key, fragment",
    [
        ({"train": 5}, "train", "must be a JSON object"),
        ({"corpus": ["a"]}, "corpus", "must be a JSON object"),
        ({"train": {"steps": True}}, "train.steps", "positive whole number"),
        ({"corpus": {"n_val": False}}, "corpus.n_val", "positive whole number"),
        ({"export": {"run_eval": "maybe"}}, "export.run_eval", "true or false"),
        ({"train": {"history": 1}}, "train.history", "true or false"),
        ({"train": {"device": "gpu0"}}, "train.device", "cuda:N"),
        ({"precompute": {"device": "cuda:x"}}, "precompute.device", "cuda:N"),
        ({"train": {"width": 100}}, "train.width", "multiple of 64"),
        ({"train": {"lr": 0}}, "train.lr", "greater than 0"),
        ({"train": {"lr": "nan"}}, "train.lr", "greater than 0"),
        ({"corpus": {"empty_frac": 0.6}}, "corpus.empty_frac", "from 0 to 0.5"),
        ({"corpus": {"mode": "folders"}}, "corpus.mode", '"presets", "files"'),
        ({"corpus": {"presets": "gustavosta,nope"}}, "corpus.presets", "list drawn from"),
        ({"corpus": {"extra_files": [1]}}, "corpus.extra_files", "list of paths"),
        ({"precompute": {"student_dtype": "int8"}}, "precompute.student_dtype", '"bf16"'),
        ({"name": "a/b"}, "name", "file name"),
        ({"name": ""}, "name", "file name"),
        ({"pack": "nope"}, "pack", "must be one of"),
        ({"hf_token": 5}, "hf_token", "must be text"),
        ({"materials": 3}, "materials", "JSON object"),
        ({"materials": {"student": {"path": 3}}}, "materials.student.path", "must be text"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_wrong_values_are_refused(raw, key, fragment):
    with pytest.raises(ConfigError) as info:
        settings_from_dict(raw)
    problems = info.value.problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(key + " "), problems[0]
    assert fragment in problems[0]


def test_min_chars_above_max_chars_is_refused():
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"corpus": {"min_chars": 100, "max_chars": 50}})
    (problem,) = info.value.problems
    assert "corpus.min_chars (100)" in problem
    assert "corpus.max_chars (50)" in problem
    # equal is fine
    assert settings_from_dict({"corpus": {"min_chars": 50, "max_chars": 50}}).corpus.min_chars == 50


@pytest.mark.parametrize("pack_id", ["qwen3vl_mageflow", "qwen3vl_qwenimage"])
def test_files_mode_is_refused_on_an_image_pack(pack_id):
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"pack": pack_id, "corpus": {"mode": "files"}})
    (problem,) = info.value.problems
    assert 'corpus.mode "files"' in problem


@pytest.mark.parametrize("pack_id", ["llada_image", "t5xxl_pixart"])
def test_files_mode_is_fine_on_a_text_pack(pack_id):
    s = settings_from_dict({"pack": pack_id, "corpus": {"mode": "files", "train_file": "t.txt",
                                                        "val_file": "v.txt"}})
    assert s.corpus.mode == "files"
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"pack": pack_id, "corpus": {"mode": "files", "train_file": "t.txt"}})
    assert info.value.problems == ['corpus.mode "files" needs both corpus.train_file and '
                                   'corpus.val_file; set them together with the mode']


def test_top_level_not_a_dict():
    with pytest.raises(ConfigError) as info:
        settings_from_dict([1, 2])
    assert info.value.problems == ["project.json must hold a JSON object of settings, got [1, 2]"]


@pytest.mark.parametrize(
    "raw, attr, expected",
    [
        ({"train": {"steps": "12k"}}, ("train", "steps"), 12000),
        ({"train": {"width": "1,024"}}, ("train", "width"), 1024),
        ({"train": {"lr": "3e-4"}}, ("train", "lr"), 3e-4),
        ({"train": {"history": "yes"}}, ("train", "history"), True),
        ({"export": {"run_eval": "off"}}, ("export", "run_eval"), False),
        ({"train": {"device": " cuda:1 "}}, ("train", "device"), "cuda:1"),
        ({"corpus": {"presets": ["vidprom", "vidprom", "gustavosta"]}}, ("corpus", "presets"),
         ["vidprom", "gustavosta"]),
        ({"corpus": {"extra_files": "a.txt, b.jsonl"}}, ("corpus", "extra_files"), ["a.txt", "b.jsonl"]),
    ],
)
def test_values_are_parsed(raw, attr, expected):
    s = settings_from_dict(raw)
    assert getattr(getattr(s, attr[0]), attr[1]) == expected


# ---------------------------------------------------------------- apply_assignments

def test_apply_assignments_parses_strings():
    raw = default_settings_dict("llada_image")
    before = copy.deepcopy(raw)
    out, s = apply_assignments(raw, [
        "train.steps=12k",
        "export.run_eval=no",
        "corpus.presets=gustavosta,vidprom",
        "materials.student.path=/x",
        "name=my_adapter",
    ])
    assert s.train.steps == 12000
    assert s.export.run_eval is False
    assert s.corpus.presets == ["gustavosta", "vidprom"]
    assert s.materials["student"].path == "/x"
    assert s.name == "my_adapter"
    # the rest unchanged
    assert s.train.lr == 2e-4
    assert s.corpus.n_train == 60000
    # the returned dict carries the assignments; the input is untouched
    assert out["materials"] == {"student": {"path": "/x"}}
    assert raw == before
    assert out is not raw


def test_apply_assignments_empty_list_value():
    out, s = apply_assignments(default_settings_dict(), ["corpus.presets=[]"])
    assert s.corpus.presets == []


def test_apply_assignments_json_list_value():
    _, s = apply_assignments(default_settings_dict(), ['corpus.presets=["diffusiondb", "vidprom"]'])
    assert s.corpus.presets == ["diffusiondb", "vidprom"]


def test_apply_assignments_value_may_contain_equals():
    _, s = apply_assignments(default_settings_dict(), ["hf_token=abc=def"])
    assert s.hf_token == "abc=def"


def test_apply_assignments_on_empty_dict_uses_defaults():
    out, s = apply_assignments({}, ["train.steps=500"])
    assert out == {"train": {"steps": "500"}}
    assert s.train.steps == 500
    assert s.train.depth == 6


def test_apply_assignments_reports_unknown_and_malformed_together():
    raw = default_settings_dict()
    before = copy.deepcopy(raw)
    with pytest.raises(ConfigError) as info:
        apply_assignments(raw, ["train.stesp=1", "nokey", "foo.bar=1", "materials.x.y=1",
                                "train.steps=12k"])
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert '"train.stesp" is not a setting (did you mean "train.steps"?)' in problems
    assert any(p.startswith('"nokey" is not a setting assignment') for p in problems)
    assert any(p.startswith('"foo.bar" is not a setting') for p in problems)
    assert any(p.startswith('"materials.x.y" is not a setting') for p in problems)
    assert raw == before


def test_apply_assignments_reports_bad_values_together():
    raw = default_settings_dict()
    before = copy.deepcopy(raw)
    with pytest.raises(ConfigError) as info:
        apply_assignments(raw, ["train.steps=abc", "export.run_eval=maybe", "train.width=100"])
    problems = info.value.problems
    assert len(problems) == 3, problems
    assert 'train.steps must be a positive whole number, got "abc"' in problems
    assert 'export.run_eval must be true or false, got "maybe"' in problems
    assert any(p.startswith("train.width ") for p in problems)
    assert raw == before


def test_apply_assignments_reports_unknown_keys_and_bad_values_together():
    # the docstring: "Every problem (unknown keys included) is reported at once."
    with pytest.raises(ConfigError) as info:
        apply_assignments(default_settings_dict(), ["train.stesp=1", "train.steps=abc"])
    problems = info.value.problems
    assert '"train.stesp" is not a setting (did you mean "train.steps"?)' in problems
    assert 'train.steps must be a positive whole number, got "abc"' in problems


def test_apply_assignments_section_without_key_hint_is_not_the_same_key():
    # "train=5" names a section, not a setting; a hint must not suggest the very key typed
    with pytest.raises(ConfigError) as info:
        apply_assignments(default_settings_dict(), ["train=5"])
    (problem,) = info.value.problems
    assert problem.startswith('"train" is a group of settings; set one of them, e.g. train.')
    assert 'did you mean "train"?' not in problem


# ---------------------------------------------------------------- round trip

@pytest.mark.parametrize("pack_id", ["llada_image", "qwen3vl_mageflow", "qwen3vl_qwenimage", "t5xxl_pixart"])
def test_to_dict_json_round_trip_is_identity(pack_id):
    raw = default_settings_dict(pack_id)
    raw["train"]["steps"] = 777
    raw["train"]["lr"] = 1.5e-4
    raw["corpus"]["extra_files"] = ["~/prompts.txt", "rel/ü.jsonl"]
    raw["materials"] = {"student": {"path": "/models/student"}}
    raw["export"]["output_dir"] = "~/out"
    s = settings_from_dict(raw)
    d = s.to_dict()
    again = settings_from_dict(json.loads(json.dumps(d)))
    assert again == s
    assert again.to_dict() == d
    assert d["materials"] == {"student": {"path": "/models/student"}}
    assert d["train"]["steps"] == 777
    assert math.isclose(d["train"]["lr"], 1.5e-4)
