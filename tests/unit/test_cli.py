"""The console scripts' ``--help`` (in-process: Hydra prints it and exits 0), the known noise they drop
exactly, the one line for a pasted path that Hydra cannot read, the model summary's FLOPs, and what a
start does once (its checks, settings, code version, storage check)."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import warnings

import lightning as L
import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from litlab.callbacks.model_summary import ModelSummaryWithMeasuredFlops
from litlab.cli import evaluate, quiet, train
from litlab.cli.preflight import check_pasted_paths
from tests.conftest import config_groups, option_names


def help_text(main, program: str, *args: str, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", [program, *args, "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_train_help_says_what_it_does_and_lists_only_the_groups_a_user_picks(monkeypatch, capsys):
    text = help_text(train.main, "litlab-train", "model=mlp", monkeypatch=monkeypatch, capsys=capsys)
    assert text.startswith("litlab-train: train a LightningModule on a LightningDataModule")
    assert "Common commands:\n  litlab-train " in text
    assert "powered by Hydra" not in text and "schema/" not in text and "== Config ==" not in text
    listed = {
        line.split()[0]: line.split(None, 1)[1].split(", ")
        for line in text.split("(* marks what this command line picks):\n", 1)[1]
        .split("\n\n", 1)[0]
        .splitlines()
    }
    user_groups = sorted(config_groups() - {"hydra", "paths"})
    assert sorted(listed) == sorted([*user_groups, "hydra/launcher"])
    for group in user_groups:
        assert [o.rstrip("*") for o in listed[group]] == option_names(group)
    # What this command line picks: its override, and the defaults for the rest.
    assert "mlp*" in listed["model"] and "digits*" in listed["data"] and "local*" in listed["hydra/launcher"]
    assert 'eval "$(litlab-train -sc install=bash)"' in text  # shell completion, among Hydra's flags


def test_a_run_composes_its_config_without_listing_the_config_groups(monkeypatch, tmp_path):
    # omegaconf resolves the help template whenever Hydra merges into it: in every compose. Listing
    # the groups there cost 0.65 s of a 0.85 s compose, three times per litlab-train start.
    from hydra._internal.hydra import Hydra

    from tests.conftest import compose_train

    listed = []
    original = Hydra.list_all_config_groups
    monkeypatch.setattr(
        Hydra, "list_all_config_groups", lambda self, *a, **k: listed.append(1) or original(self, *a, **k)
    )
    monkeypatch.setattr(sys, "argv", ["litlab-train", "model=mlp"])
    compose_train(["model=mlp"], tmp_path)
    assert listed == []  # --help still lists them: test_train_help_says_what_it_does_and_lists_...


def test_eval_help_says_what_it_does_and_how_to_quote_a_path(monkeypatch, capsys):
    text = help_text(evaluate.main, "litlab-eval", monkeypatch=monkeypatch, capsys=capsys)
    assert text.startswith("litlab-eval: test a checkpoint that litlab-train wrote")
    assert "litlab-eval ckpt_path=" in text and "'ckpt_path=\"/runs/a=b/last.ckpt\"'" in text
    assert "Config groups" not in text and "powered by Hydra" not in text


def test_a_pasted_path_hydra_cannot_read_gets_one_line_on_how_to_quote_it(capsys):
    for args in (["ckpt_path=/runs/epoch=007-step=000160.ckpt"], ["resume=/runs/a,b/last.ckpt", "seed=1"]):
        with pytest.raises(SystemExit) as exited:
            check_pasted_paths(args)
        assert exited.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        key, _, path = args[0].partition("=")
        assert line.startswith(f"litlab: error: {args[0]} holds ")
        suggested = f"'{key}=\"{path}\"'"
        assert line.endswith(f"quote the path for Hydra and the shell, e.g. {suggested}")
        # As the shell hands it over, Hydra reads the path back as it was.
        (override,) = OverridesParser.create().parse_overrides(shlex.split(suggested))
        assert override.key_or_group == key and override.value() == path
    check_pasted_paths(["ckpt_path=/runs/epoch_007-step_000160.ckpt", "resume=auto"])  # nothing to say
    check_pasted_paths(["-m", "ckpt_path=/runs/a.ckpt,/runs/b.ckpt"])  # a sweep over checkpoints is one


def test_known_noise_is_dropped_exactly_and_other_warnings_still_show(tmp_path):
    import importlib

    import gcsfs
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.trainer.call import _call_callbacks_on_load_checkpoint
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    (tmp_path / "last.ckpt").write_bytes(b"")  # a run's own checkpoint folder, as a resumed run finds it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.drop_known_noise()
        quiet.drop_known_noise()  # idempotent
        # Each from its source, and one just like the first elsewhere: torch's deprecation as
        # Lightning's pytree helper triggers it; Lightning's on a resumed run's folder, and on eval's
        # and predict's checkpoint, which they load without the training callbacks.
        from lightning.pytorch.utilities._pytree import _tree_flatten

        _tree_flatten(1)
        ModelCheckpoint(dirpath=tmp_path).setup(trainer, L.LightningModule(), "fit")
        stored = {"callbacks": {"EpochCheckpoint{}": {}}, "pytorch-lightning_version": L.__version__}
        _call_callbacks_on_load_checkpoint(trainer, stored)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("a user's own warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "`isinstance(treespec, LeafSpec)` is deprecated",
        "a user's own warning",
    ]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch.utilities.rank_zero", "gcsfs")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        rank_zero_info(
            "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
        )
        rank_zero_info("GPU available: False, used: False")
        importlib.reload(gcsfs)  # its import logs that its experimental features are on
        logging.getLogger("gcsfs").info("another gcsfs line")
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert [r.getMessage() for r in records] == ["GPU available: False, used: False", "another gcsfs line"]


class TinyNet(L.LightningModule):
    def __init__(self, with_example_input: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)
        if with_example_input:
            self.example_input_array = torch.zeros(2, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_the_model_summary_shows_counted_flops_or_no_flops_column(caplog):
    from lightning.pytorch.utilities.model_summary import summarize

    def printed(module: L.LightningModule) -> str:
        summary = summarize(module)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="litlab"):
            ModelSummaryWithMeasuredFlops.summarize(
                summary._get_summary_data(),
                summary.total_parameters,
                summary.trainable_parameters,
                summary.model_size,
                summary.total_training_modes,
                total_flops=summary.total_flops,
            )
        (record,) = caplog.records
        return record.getMessage()

    counted = printed(TinyNet(with_example_input=True))
    assert "FLOPs" in counted.splitlines()[1]  # the column, with Lightning's count: 2 x 16 x 4 x 2
    assert counted.splitlines()[-1] == f"{'256':<10}Total Flops"
    uncounted = printed(TinyNet(with_example_input=False))
    assert "FLOPs" not in uncounted and "Flops" not in uncounted
    assert uncounted.splitlines()[-1].endswith("Modules in eval mode")


@pytest.mark.parametrize("typo", ["model.net.hiden=3", "compile=null"])
def test_a_sweep_whose_key_or_value_does_not_compose_ends_in_the_single_runs_one_line(typo, capsys):
    """``-m seed=1,2 model.net.hiden=3`` used to print Hydra's "Could not override" block and exit 1:
    Hydra composes a sweep's base config before any sweeper runs. The preflight composes it first."""
    from litlab.cli import preflight

    def refused(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exited:
            preflight.check_or_exit("train", args)
        assert exited.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        return line

    single = refused(["seed=1", typo])
    assert single.startswith("litlab: error: ") and f"'{typo.split('=')[0]}'" in single
    assert refused(["-m", "seed=1,2", typo]) == single


def test_a_rank_lightning_started_from_a_checked_run_composes_without_checking_again(monkeypatch, capsys):
    """Lightning's launcher re-runs the command for each other rank (LOCAL_RANK set): the first process
    marks them before they start, and they skip its checks; a torchrun rank (no mark) checks alone."""
    from litlab.cli import api

    monkeypatch.delenv(api._CHECKED_ENV, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    args = ["trainer.max_epoch=3"]  # composes; its check refuses it
    with pytest.raises(SystemExit) as exited:
        api._config_to_run("train", args)
    assert exited.value.code == 2 and "'trainer.max_epoch'" in capsys.readouterr().err
    monkeypatch.setenv(api._CHECKED_ENV, str(os.getppid()))  # this process's parent marked it
    assert api._config_to_run("train", args).trainer.max_epoch == 3
    assert api._CHECKED_ENV not in os.environ  # what this rank starts checks again

    # A command that rank 0 (LOCAL_RANK=0) or a rank starts, or another process's mark: checked.
    for local_rank, marked_by in (("0", os.getppid()), ("1", os.getpid()), ("1", 1)):
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        monkeypatch.setenv(api._CHECKED_ENV, str(marked_by))
        with pytest.raises(SystemExit) as exited:
            api._config_to_run("train", args)
        assert exited.value.code == 2, (local_rank, marked_by)


def test_a_start_computes_its_settings_code_version_and_storage_check_once(tmp_path, monkeypatch):
    from litlab.cli import preflight
    from litlab.config import identity
    from litlab.storage import roots

    calls: list[str] = []
    for module, name in ((identity, "_settings"), (identity, "_code_files"), (roots, "check_storage")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    args = ["model=mlp", f"paths.log_dir={tmp_path}"]
    with identity.one_start():
        cfg = preflight.checked_config("train", args)
        for _ in range(2):  # Hydra naming the run folder, then Lightning asking for it again
            identity.run_folder(cfg)
        identity.start_record(cfg, cfg.hydra, identity.run_settings(cfg))  # prepare_run
    assert sorted(calls) == ["_code_files", "_settings", "check_storage"]
    identity.run_settings(cfg)  # outside a start: the user's files may have changed
    assert calls.count("_settings") == 2
