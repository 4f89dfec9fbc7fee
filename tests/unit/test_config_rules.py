"""The config rules types cannot express (``litlab.config.rules``): each bad value is refused with one
sentence naming the key, the value and what is allowed; batch sizes follow from devices, nodes and
accumulation; a run's identity hashes what it trains."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

from litlab.config import rules
from litlab.config.identity import run_identity, run_settings
from litlab.config.rules import BatchSizes, ConfigError
from tests.conftest import compose_train

# Composed once, at import: composing costs more than the checks under test, and mutmut's runs
# (make mutation) are forked after the import, so each mutant's run reuses it.
COMPOSED = compose_train(["trainer.devices=1"], Path("run"))
WITHOUT_HYDRA = OmegaConf.masked_copy(COMPOSED, [k for k in COMPOSED if k != "hydra"])


@pytest.fixture
def cfg() -> DictConfig:
    """The train config without its hydra node (the rules skip it), fresh for each test."""
    return copy.deepcopy(WITHOUT_HYDRA)


def with_values(cfg: DictConfig, **values) -> DictConfig:
    """``cfg`` with dotted keys (``trainer__max_epochs``) set, as an override would set them."""
    for key, value in values.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


def test_the_default_config_passes(cfg):
    rules.check(cfg)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"trainer__max_epochs": 0},
            "trainer.max_epochs=0 is not allowed: use a positive integer, or -1 with",
        ),
        ({"trainer__max_steps": 0}, "trainer.max_steps=0 is not allowed: use a positive integer, or -1 (no"),
        (
            {"trainer__accumulate_grad_batches": 0},
            "trainer.accumulate_grad_batches=0 is not allowed: use a pos",
        ),
        ({"trainer__num_nodes": 0}, "trainer.num_nodes=0 is not allowed"),
        ({"data__batch_size": 0}, "data.batch_size=0 is not allowed: use a positive integer"),
        ({"data__batch_size": True}, "data.batch_size=True is not allowed"),
        ({"data__batch_size": 2.5}, "data.batch_size=2.5 is not allowed"),
        ({"global_batch_size": 0}, "global_batch_size=0 is not allowed"),
        (
            {"data__global_batch_size": 96},
            "data.global_batch_size=96 is not a key of your data config: remove it there and set the "
            "top-level global_batch_size",
        ),
        (
            {"trainer__devices": 0},
            "trainer.devices=0 is not allowed: use a positive integer, a list of device",
        ),
        ({"trainer__devices": "two"}, "trainer.devices=two is not allowed"),
        (
            {"precision__value": "fp61"},
            "precision.value=fp61 is not allowed: use one of 32-true, 16-mixed, bf",
        ),
        ({"optimized_metric_mode": "up"}, "optimized_metric_mode=up is not allowed: use one of min, max"),
        (
            {"trainer__accelerator": "abacus"},
            "trainer.accelerator=abacus is not allowed: use one of auto, cpu,",
        ),
        ({"on_nonfinite": "ignore"}, "on_nonfinite=ignore is not allowed: use one of fail, skip"),
        ({"oom__action": "pray"}, "oom.action=pray is not allowed: use one of fail, auto_shrink"),
        ({"oom__max_shrinks": 0}, "oom.max_shrinks=0 is not allowed"),
        ({"oom__within_steps": 0}, "oom.within_steps=0 is not allowed"),
        (
            {"trainer__gradient_clip_algorithm": "l3"},
            "trainer.gradient_clip_algorithm=l3 is not allowed: use one",
        ),
        (
            {"trainer__gradient_clip_val": -1.0},
            "trainer.gradient_clip_val=-1.0 is not allowed: use a positive",
        ),
        ({"tune__mode": "guess"}, "tune.mode=guess is not allowed: use one of power, binsearch"),
        ({"tune__init_val": 0}, "tune.init_val=0 is not allowed"),
        ({"tune__max_trials": 0}, "tune.max_trials=0 is not allowed"),
        ({"tune__steps_per_trial": 0}, "tune.steps_per_trial=0 is not allowed"),
        ({"tune__max_val": 0}, "tune.max_val=0 is not allowed"),
        (
            {"tune__batch_size": True, "global_batch_size": 64},
            "tune.batch_size=true cannot tune global_batch_size=64: set one of them, not both",
        ),
        (
            {"tune__batch_size": True, "trainer__devices": 2, "trainer__accelerator": "cpu"},
            "tune.batch_size=true runs on one device, not trainer.devices=2 trainer.num_nodes=1",
        ),
        (
            {"tune__batch_size": True, "trainer__num_nodes": 2},
            "tune.batch_size=true runs on one device, not trainer.devices=1 trainer.num_nodes=2",
        ),
        (
            {"global_batch_size": 63, "trainer__devices": 2, "trainer__accumulate_grad_batches": 2},
            "global_batch_size=63 does not divide into devices x num_nodes x accumulate_grad_batches "
            "= 2 x 1 x 2",
        ),
        (
            {"global_batch_size": 63, "trainer__num_nodes": 2, "trainer__accumulate_grad_batches": 2},
            "global_batch_size=63 does not divide into 2 ranks x accumulate_grad_batches=2",
        ),
    ],
)
def test_a_bad_value_is_refused_with_one_sentence_naming_it(cfg, values, message, monkeypatch):
    monkeypatch.setattr(rules, "cpu_cores", lambda: 4)  # the 2-device rows must not hit the core limit
    with pytest.raises(ConfigError) as raised:
        rules.check(with_values(cfg, **values))
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "values",
    [
        {"trainer__max_epochs": -1, "trainer__max_steps": 10},
        {"trainer__max_epochs": 1, "trainer__max_steps": -1},
        {"trainer__devices": "auto"},
        {"trainer__devices": [0]},
        {"trainer__gradient_clip_val": 0.0},
        {"trainer__gradient_clip_val": None},
        {"trainer__gradient_clip_algorithm": "value"},
        {"global_batch_size": 64, "trainer__devices": 2, "trainer__accelerator": "cpu"},
        {"tune__batch_size": True, "trainer__devices": 1},
    ],
)
def test_allowed_edge_values_pass(cfg, values, monkeypatch):
    monkeypatch.setattr(rules, "cpu_cores", lambda: 4)
    rules.check(with_values(cfg, **values))


def test_more_cpu_devices_than_usable_cores_are_refused_naming_the_cores(cfg, monkeypatch):
    monkeypatch.setattr(rules, "cpu_cores", lambda: 2)
    rules.check(with_values(cfg, trainer__accelerator="cpu", trainer__devices=2))
    with pytest.raises(ConfigError, match=r"^trainer.devices=3 is more than the 2 CPU cores this process"):
        rules.check(with_values(cfg, trainer__devices=3))
    rules.check(with_values(cfg, trainer__accelerator="gpu"))  # GPU devices are not CPU processes


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_cpu_cores_are_the_cores_this_process_may_use_not_the_machines():
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})  # as a Slurm step or a container's cpuset would
        assert rules.cpu_cores() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert rules.cpu_cores() == len(allowed)


@pytest.mark.parametrize(
    ("values", "setting"),
    [({}, None), ({"global_batch_size": 64}, "global_batch_size=64"), ({"tune__batch_size": True},
     "tune.batch_size=true"), ({"oom__action": "auto_shrink"}, "oom=auto_shrink")],
)  # fmt: skip
def test_a_data_config_without_batch_size_is_refused_only_where_a_setting_needs_one(cfg, values, setting):
    # A datamodule may size its batches itself (Lightning's BoringDataModule): no micro-batch to derive,
    # tune or halve, and no effective batch to report.
    with open_dict(cfg):
        del cfg.data["batch_size"]
    with_values(cfg, **values)
    if setting is None:
        rules.check(cfg)
        assert rules.batch_sizes(cfg.data, cfg.trainer) == BatchSizes(None, 1, 1, None)
        return
    with pytest.raises(ConfigError, match=f"^{setting} needs data.batch_size: it .* and your data config "):
        rules.check(cfg)


def test_an_added_key_is_named_with_the_allowed_ones(cfg):
    with pytest.raises(ConfigError, match=r"^unknown key 'tune.max_trial': allowed keys are .*max_trials"):
        rules.check(with_values(copy.deepcopy(cfg), tune__max_trial=3))
    with pytest.raises(ConfigError, match=r"^unknown key 'oom.retries'"):
        rules.check(with_values(cfg, oom__retries=3))


def test_trainer_keys_the_yaml_leaves_out_have_lightnings_defaults(cfg):
    with open_dict(cfg):
        for key in (
            "accelerator",
            "devices",
            "num_nodes",
            "max_epochs",
            "max_steps",
            "accumulate_grad_batches",
        ):
            del cfg.trainer[key]
        del cfg.trainer["gradient_clip_val"], cfg.trainer["gradient_clip_algorithm"]
    rules.check(cfg)
    assert rules.batch_sizes(cfg.data, cfg.trainer) == BatchSizes(
        cfg.data.batch_size, 1, 1, cfg.data.batch_size
    )


def test_a_missing_value_is_named(cfg):
    with open_dict(cfg):
        cfg.data.root = "???"
    with pytest.raises(ConfigError, match=r"^data.root is required: set it, e.g. data.root=\.\.\.$"):
        rules.check(cfg)


def test_a_mounted_storage_without_its_root_names_the_missing_key(tmp_path):
    # It used to say "storage root ??? does not exist: mount the drive there first".
    from litlab.cli.preflight import check_storage_and_resume
    from litlab.storage.roots import StorageError

    cfg = compose_train(["storage=mounted"], tmp_path)
    with pytest.raises(StorageError, match=r"^storage=mounted needs storage.root, e.g. storage.root=/mnt/"):
        check_storage_and_resume(cfg)


def test_a_missing_value_in_a_list_is_named_by_its_index(cfg):
    with open_dict(cfg):
        cfg.data.augment = [{"_target_": "x", "degrees": "???"}]
    with pytest.raises(ConfigError, match=r"^data.augment.0.degrees is required"):
        rules.check(cfg)


@pytest.mark.parametrize(
    ("devices", "count"),
    [
        (2, 2),
        (0, None),
        (-1, None),
        ("3", 3),
        (" 2 ", 2),
        ("0,1,", 2),
        ("auto", None),
        ([0, 1, 2], 3),
        (True, None),
        (None, None),  # a config without trainer.devices (Summary.of reads what is there)
    ],
)
def test_device_count_reads_every_form_of_trainer_devices(devices, count):
    assert rules.device_count(devices) == count


@pytest.mark.parametrize(
    ("data", "trainer", "world_size", "expected", "global_batch"),
    [
        (
            {"batch_size": 8},
            {"devices": 2, "num_nodes": 3, "accumulate_grad_batches": 4},
            None,
            (8, 4, 6, 192),
            None,
        ),
        (
            {"batch_size": 8},
            {"devices": "auto", "num_nodes": 1, "accumulate_grad_batches": 1},
            None,
            (8, 1, 1, 8),
            None,
        ),
        (
            {"batch_size": 8},
            {"devices": "auto", "num_nodes": 1, "accumulate_grad_batches": 1},
            4,
            (8, 1, 4, 32),
            None,
        ),
        (
            {"batch_size": 8},
            {"devices": 2, "num_nodes": 2, "accumulate_grad_batches": 3},
            None,
            (8, 3, 4, 96),
            96,
        ),
        (
            {"batch_size": 999},
            {"devices": 1, "num_nodes": 1, "accumulate_grad_batches": 2},
            None,
            (32, 2, 1, 64),
            64,
        ),
    ],
)
def test_batch_sizes_derive_the_micro_batch_and_the_effective_batch(
    data, trainer, world_size, expected, global_batch
):
    sizes = rules.batch_sizes(OmegaConf.create(data), OmegaConf.create(trainer), world_size, global_batch)
    assert sizes == BatchSizes(*expected)
    assert all(type(size) is int for size in (sizes.micro, sizes.effective))  # a batch is whole samples


def test_eval_needs_a_checkpoint_file_that_is_a_zip_archive(tmp_path):
    with pytest.raises(ConfigError, match="^ckpt_path is required: litlab-eval ckpt_path="):
        rules.check_eval(OmegaConf.create({"ckpt_path": "???"}))
    missing = tmp_path / "none.ckpt"
    with pytest.raises(ConfigError, match=f"^ckpt_path={missing} is not a file$"):
        rules.check_eval(OmegaConf.create({"ckpt_path": str(missing)}))
    text = tmp_path / "text.ckpt"
    text.write_text("hello")
    with pytest.raises(ConfigError) as raised:
        rules.check_eval(OmegaConf.create({"ckpt_path": str(text)}))
    assert str(raised.value) == (
        f"ckpt_path={text} is not a checkpoint: pass a .ckpt file that litlab-train wrote, "
        "e.g. <run dir>/checkpoints/last.ckpt"
    )
    archive = tmp_path / "last.ckpt"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("data.pkl", b"x")
    rules.check_eval(OmegaConf.create({"ckpt_path": str(archive)}))
    rules.check_eval(OmegaConf.create({"ckpt_path": "s3://bucket/run/last.ckpt"}))  # checked when read


def identity_of(*overrides: str) -> str:
    """The identity of the config composed with these overrides."""
    return run_identity(compose_train(list(overrides), Path("run")))


def test_the_identity_hashes_what_the_run_trains_not_where_or_how_it_is_launched():
    plain = identity_of("model=mlp", "trainer.max_epochs=3")
    assert identity_of("trainer.max_epochs=3", "model=mlp") == plain  # order does not matter
    launch_only = [
        "hydra.job.name=x",
        "resume=never",
        "run_name=",
        "paths.log_dir=/tmp/x",
        "storage.root=/tmp/y",
        "storage=s3",
        "hydra.launcher.devices=2",
        "+paths.extra=1",
        "storage.copy_logs=true",
        "logger=csv",
        "hang_timeout=60",
    ]
    assert identity_of("model=mlp", "trainer.max_epochs=3", *launch_only) == plain
    # What the run trains, resolved: the default value spelled out, or spelled otherwise, is the same run.
    assert identity_of("model=mlp", "trainer.max_epochs=3", "optimizer.lr=3e-3", "seed=42") == plain
    # Values equal as numbers are one setting, whichever type the spelling gave them.
    assert identity_of("model=mlp", "trainer.max_epochs=3", "optimizer.weight_decay=0") == identity_of(
        "model=mlp", "trainer.max_epochs=3", "optimizer.weight_decay=0.0"
    )
    assert identity_of("model=mlp", "trainer.max_epochs=4") != plain
    assert identity_of("model=mlp", "trainer.max_epochs=3", "+trainer.extra=1") != plain
    assert identity_of("model=mlp", "trainer.max_epochs=3", "seed=7") != plain
    assert identity_of() != plain
    # The experiment name and the first 10 hex digits of the SHA-1 of the sorted settings, as JSON,
    # a float equal to an integer written as that integer.
    settings = run_settings(compose_train(["model=mlp", "trainer.max_epochs=3"], Path("run")))
    assert settings["trainer.max_epochs"] == 3 and settings["optimizer.lr"] == 0.003
    assert not any(key.split(".")[0] in ("hydra", "paths", "storage", "logger") for key in settings)
    assert settings["trainer.overfit_batches"] == 0.0
    as_numbers = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in settings.items()}
    digest = hashlib.sha1(json.dumps(as_numbers, sort_keys=True).encode()).hexdigest()[:10]
    assert plain == f"{COMPOSED.experiment_name}-{digest}"


def test_a_run_name_is_the_identity():
    assert identity_of("model=mlp", "run_name=mine") == "mine"


def test_an_accumulation_typed_as_text_is_refused_never_multiplied(cfg):
    """``trainer.accumulate_grad_batches=02`` in a sweep is the string "02": a failed row's effective
    batch was 64 x "02", the string repeated."""
    from litlab.run.summary import Summary

    cfg.trainer.accumulate_grad_batches = "02"
    with pytest.raises(ConfigError, match=r"^trainer.accumulate_grad_batches=02 is not allowed"):
        rules.batch_sizes(cfg.data, cfg.trainer)
    summary = Summary.of(cfg, "refused", run_dir=None, hydra=None)
    assert summary.effective_batch_size is None and summary.accumulate_grad_batches == "02"


def test_a_failed_summary_of_a_config_without_a_trainer_says_what_is_there():
    """Summary.of describes whatever config it is given; one without ``trainer.devices`` gave
    ``TypeError: object of type 'NoneType' has no len()`` instead of a summary."""
    from litlab.run.summary import Summary

    summary = Summary.of(OmegaConf.create({"seed": 3}), "refused", run_dir=None, hydra=None)
    assert summary.devices is None and summary.world_size is None and summary.error == "refused"
