"""Every ``_target_`` node's keys, and trainer's against lightning.Trainer, are checked against the
signature, read from source when it can be.

Targets in a package written by the test: its modules import something that does not exist, so
reading a signature by importing them would fail; the AST path must not import them. Lightning's
and torch's targets are read from the installed sources and compared with the imported signature.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import open_dict

from litlab.config import preflight, signatures
from litlab.config.preflight import CONFIG_DIR, ENGINE_CONFIG_DIR
from litlab.config.rules import ConfigError
from litlab.config.signatures import KEYWORDS_PASSED_ON
from tests.conftest import REPO, compose_train

PACKAGE = {
    "__init__.py": "from .nets import Net as Net\nfrom .nets import Wide\n",
    "nets.py": """
        import module_that_is_not_installed  # importing this file fails: the AST must not import it
        from torch import nn

        class Net(nn.Module):
            def __init__(self, width: int, depth: int = 2, *, dropout: float = 0.0) -> None:
                super().__init__()

        class Wide(Net):
            pass

        class Open:
            def __init__(self, size, **kwargs):
                pass

        def schedule(optimizer, total_steps, warmup_steps=0):
            return None
    """,
}
# A module whose class has a decorator: its signature may not be what the source says, so it is imported.
DECORATED = """
    def wrap(cls):
        return cls

    @wrap
    class Wrapped:
        def __init__(self, a, b=1):
            pass
"""

CONFIG_DIRS = [CONFIG_DIR, ENGINE_CONFIG_DIR]  # where the configs are read from (preflight.config_dirs)


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "fakepkg"
    root.mkdir()
    for name, text in PACKAGE.items():
        (root / name).write_text(textwrap.dedent(text))
    (tmp_path / "fakedecorated.py").write_text(textwrap.dedent(DECORATED))
    monkeypatch.syspath_prepend(str(tmp_path))
    signatures.signature_of.cache_clear()
    signatures._module_tree.cache_clear()
    yield "fakepkg"
    signatures.signature_of.cache_clear()
    signatures._module_tree.cache_clear()
    for name in ("fakepkg", "fakedecorated"):
        sys.modules.pop(name, None)


def test_a_signature_is_read_from_source_through_re_exports_and_base_classes(package):
    assert signatures.signature_of("fakepkg.nets.Net") == signatures.Signature(
        ("width", "depth", "dropout"), False
    )
    assert signatures.signature_of("fakepkg.Net").names == ("width", "depth", "dropout")  # re-exported
    assert signatures.signature_of("fakepkg.Wide").names == ("width", "depth", "dropout")  # inherited
    assert signatures.signature_of("fakepkg.nets.schedule").names == (
        "optimizer",
        "total_steps",
        "warmup_steps",
    )
    assert signatures.signature_of("fakepkg.nets.Open").any_keyword
    assert "fakepkg.nets" not in sys.modules  # read, not imported


def test_a_target_the_source_cannot_tell_about_is_imported_and_inspected(package):
    assert signatures.signature_of("fakedecorated.Wrapped").names == ("a", "b")
    assert "fakedecorated" in sys.modules


def test_an_unknown_key_names_the_key_the_file_and_the_accepted_keys(tmp_path):
    cfg = compose_train(["model=mlp"], tmp_path)
    with open_dict(cfg):  # as if configs/model/mlp.yaml said `hiden: 3`
        cfg.model.net.hiden = 3
    with pytest.raises(ConfigError) as error:
        signatures.check(cfg, ["model=mlp"], CONFIG_DIRS)
    assert str(error.value) == (
        "unknown key 'model.net.hiden' in configs/model/mlp.yaml: project.vision.nets.MLP accepts "
        "image_shape, num_classes, hidden_sizes, dropout"
    ).replace("configs/", f"{_shown(CONFIG_DIR)}/")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def test_a_key_set_on_the_command_line_is_named_as_such(tmp_path):
    cfg = compose_train(["+optimizer.lrr=0.1"], tmp_path)
    with pytest.raises(
        ConfigError, match=r"'optimizer.lrr' on the command line: torch.optim.AdamW accepts params, lr"
    ):
        signatures.check(cfg, ["+optimizer.lrr=0.1"], CONFIG_DIRS)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=resnet", "data=synthetic"],
        ["global_batch_size=128"],
        ["scheduler=cosine"],
        ["experiment=digits_cnn"],
    ],
    ids=["default", "resnet", "global batch", "scheduler", "experiment"],
)
def test_the_shipped_configs_pass(overrides, tmp_path):
    signatures.check(compose_train(overrides, tmp_path), overrides, CONFIG_DIRS)


def test_a_typo_fails_within_a_second_without_importing_torch_or_your_code():
    code = textwrap.dedent(
        """
        import sys, time
        from litlab.cli.train import main

        def refused(*args):
            sys.argv = ["litlab-train", *args]
            start = time.process_time()
            try:
                main()
            except SystemExit as exit:
                loaded = ("torch", "lightning", "project.vision.nets")
                print(exit.code, sorted(m for m in loaded if m in sys.modules), time.process_time() - start)

        refused("trainer.max_epoch=3")  # the first: nothing cached yet
        refused("+model.net.hiden=3")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    lines = [line.split(" ", 2) for line in result.stdout.splitlines()]
    assert [line[:2] for line in lines] == [["2", "[]"], ["2", "[]"]], result.stdout + result.stderr
    assert float(lines[0][2]) < 1.0, "CPU seconds to compose and refuse a trainer typo"
    trainer_line, model_line = result.stderr.splitlines()
    assert trainer_line.startswith(
        "litlab: error: unknown key 'trainer.max_epoch' on the command line: lightning.Trainer accepts "
    )
    assert "max_epochs" in trainer_line
    assert "unknown key 'model.net.hiden' on the command line: project.vision.nets.CNN accepts" in model_line


# --- trainer: any lightning.Trainer argument, checked against lightning.Trainer -----------------


def test_trainer_keys_are_read_from_lightning_trainer_as_its_own_signature_says():
    import lightning

    assert (
        "torch" in sys.modules
    )  # the test process had imported torch anyway; the subprocess test shows none
    parameters = inspect.signature(lightning.Trainer).parameters
    assert signatures.signature_of("lightning.Trainer").names == tuple(parameters)


def test_a_trainer_typo_names_the_file_the_key_and_every_trainer_argument_litlab_does_not_set(tmp_path):
    import lightning

    cfg = compose_train([], tmp_path)
    cfg.trainer.max_epoch = 3  # as if the engine's trainer/default.yaml said `max_epoch: 3`
    accepted = [
        k for k in inspect.signature(lightning.Trainer).parameters if k not in signatures.SET_BY_LITLAB
    ]
    with pytest.raises(ConfigError) as error:
        preflight.check_train_config(cfg, [])
    assert str(error.value) == (
        f"unknown key 'trainer.max_epoch' in {_shown(ENGINE_CONFIG_DIR)}/trainer/default.yaml: "
        f"lightning.Trainer accepts {', '.join(accepted)}"
    )
    assert "sync_batchnorm" in accepted and "callbacks" not in accepted


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.max_epochs=abc"],
            "trainer.max_epochs=abc on the command line is not allowed: "
            "lightning.Trainer takes max_epochs as int or None",
        ),
        (
            ["trainer.devices=true"],
            "trainer.devices=true on the command line is not allowed: "
            "lightning.Trainer takes devices as int or list or str",
        ),
        (
            ["+trainer.sync_batchnorm=1"],
            "trainer.sync_batchnorm=1 on the command line is not allowed: "
            "lightning.Trainer takes sync_batchnorm as bool",
        ),
        (
            ["trainer.callbacks=[]"],
            "'trainer.callbacks' on the command line is not allowed: litlab passes "
            "lightning.Trainer its callbacks from the callbacks group: choose callbacks=NAME or set "
            "callbacks.NAME.KEY",
        ),
    ],
    ids=["int", "no bool for devices", "no int for a bool", "set by litlab"],
)
def test_a_wrong_trainer_value_is_one_line_before_any_run(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        preflight.check_train_config(compose_train(overrides, tmp_path), overrides)
    assert str(error.value) == message


def test_any_trainer_argument_reaches_lightning_trainer(tmp_path, monkeypatch):
    import lightning

    from litlab.run import build
    from litlab.run.lifecycle import Run
    from litlab.storage.roots import RunStorage

    overrides = [
        "trainer.sync_batchnorm=true",
        "trainer.min_steps=10",
        "+trainer.use_distributed_sampler=false",
    ]
    cfg = compose_train(["model=mlp", *overrides], tmp_path)
    preflight.check_train_config(cfg, overrides)
    given = {}

    class RecordingTrainer(lightning.Trainer):  # the real Trainer, and the arguments litlab gave it
        def __init__(self, **kwargs):
            given.update(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(build.L, "Trainer", RecordingTrainer)
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    run = Run(dir=tmp_path, identity="keys", storage=RunStorage(str(tmp_path / "storage"), "keys"))
    trainer = build.build_trainer(cfg, run)
    assert (given["sync_batchnorm"], given["min_steps"], given["use_distributed_sampler"]) == (
        True,
        10,
        False,
    )
    assert trainer.fit_loop.min_steps == 10


# --- the engine's groups with a _target_: strategy, callbacks, logger ----------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["strategy=ddp", "+strategy.static_grap=true"],
            "unknown key 'strategy.static_grap' on the "
            "command line: lightning.pytorch.strategies.DDPStrategy accepts accelerator, ",
        ),
        (
            ["strategy=ddp", "strategy.static_graph=yes"],
            "strategy.static_graph=yes on the command line "
            "is not allowed: lightning.pytorch.strategies.DDPStrategy takes static_graph as bool",
        ),
        (
            ["strategy=fsdp", "strategy.auto_wrap_policy.min_num_params=abc"],
            "strategy.auto_wrap_policy."
            "min_num_params=abc on the command line is not allowed: torch.distributed.fsdp.wrap."
            "size_based_auto_wrap_policy takes min_num_params as int",
        ),
        (
            ["strategy=ddp", "+strategy.timeout.second=3"],
            "unknown key 'strategy.timeout.second' on the "
            "command line: datetime.timedelta accepts days, seconds, ",
        ),
        (
            ["+strategy.static_graph=true"],
            "unknown key 'strategy.static_graph' on the command line: "
            "strategy has _target_ null (nothing is built from it), so it takes only name",
        ),
        (
            ["+callbacks.checkpoint.save_topk=2"],
            "unknown key 'callbacks.checkpoint.save_topk' on the command line: "
            "litlab.storage.checkpoints.run_checkpoints accepts dirpath, ",
        ),
        (
            ["callbacks.checkpoint.save_top_k=two"],
            "callbacks.checkpoint.save_top_k=two on the command line is not allowed: "
            "litlab.storage.checkpoints.run_checkpoints takes save_top_k as int",
        ),
        (
            ["callbacks=early_stopping", "callbacks.early_stopping.patience=abc"],
            "callbacks.early_stopping.patience=abc on the command line is not allowed: "
            "lightning.pytorch.callbacks.EarlyStopping takes patience as int",
        ),
        (
            ["+trainer._target_=my.Trainer"],
            "unknown key 'trainer._target_' on the command line: lightning.Trainer accepts accelerator, ",
        ),
        (
            ["logger=csv", "+logger.csv.flush_log_every=3"],
            "unknown key 'logger.csv.flush_log_every' on "
            "the command line: lightning.pytorch.loggers.CSVLogger accepts save_dir, ",
        ),
    ],
    ids=[
        "ddp key",
        "ddp type",
        "fsdp wrap policy",
        "timeout",
        "auto",
        "callback",
        "callback type",
        "lightning callback",
        "trainer is built by litlab",
        "logger",
    ],
)
def test_the_engine_groups_are_checked_against_their_target(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        signatures.check(compose_train(overrides, tmp_path), overrides, CONFIG_DIRS)
    assert str(error.value).startswith(message)


def test_strategy_keywords_reach_the_torch_wrapper_named_in_keywords_passed_on():
    """DDPStrategy and FSDPStrategy take **kwargs and pass them to torch's wrapper, with the
    arguments KEYWORDS_PASSED_ON lists given by the strategy itself: as the installed source says."""
    ddp = _source("lightning.pytorch.strategies.ddp")
    assert "self._ddp_kwargs = kwargs" in ddp
    assert "DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)" in ddp
    fsdp = _source("lightning.pytorch.strategies.fsdp")
    call = re.search(r"FullyShardedDataParallel\((.*?)\)\n", fsdp, re.DOTALL).group(1)
    given = re.findall(r"(\w+)=", call)
    assert given[0] == "module" and "device_id" in given and "**self.kwargs" in call
    assert KEYWORDS_PASSED_ON["lightning.pytorch.strategies.DDPStrategy"][1] == ("module", "device_ids")
    fsdp_given = KEYWORDS_PASSED_ON["lightning.pytorch.strategies.FSDPStrategy"][1]
    fsdp_names = signatures.signature_of("lightning.pytorch.strategies.FSDPStrategy").names
    assert all(name in fsdp_given or name in fsdp_names for name in given)
    ddp_names = signatures.signature_of("lightning.pytorch.strategies.DDPStrategy").names
    assert {"find_unused_parameters", "static_graph", "start_method"} <= set(ddp_names)


def _source(module: str) -> str:
    tree_module = importlib.util.find_spec(module.split(".")[0]).submodule_search_locations[0]
    return (Path(tree_module, *module.split(".")[1:]).with_suffix(".py")).read_text()


METRICS = """
    import lightning as L
    from lightning.pytorch.callbacks import Callback

    class Logs(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            self.log("val/mse", 0.0)

    class LogsADict(Logs):
        def test_step(self, batch, batch_idx):
            self.log_dict({"test/mse": 0.0})

    class LogsNothingItself(L.LightningModule):
        pass

    class F1(Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            pl_module.log("val/f1", 1.0)
"""


@pytest.mark.parametrize(
    ("module", "callback", "refused"),
    [
        ("Logs", None, True),
        ("Logs", "F1", False),
        ("LogsADict", None, False),
        ("LogsNothingItself", None, False),
    ],
)
def test_a_metric_is_refused_only_where_the_source_tells_that_nothing_logs_it(
    tmp_path, monkeypatch, module, callback, refused
):
    (tmp_path / "fakemetrics.py").write_text(textwrap.dedent(METRICS))
    monkeypatch.syspath_prepend(str(tmp_path))
    signatures._module_tree.cache_clear()
    cfg = compose_train(["optimized_metric=val/f1"], tmp_path)
    with open_dict(cfg):
        cfg.model = {"_target_": f"fakemetrics.{module}"}
        if callback:
            cfg.callbacks.f1 = {"_target_": f"fakemetrics.{callback}"}
    if not refused:  # a log_dict, a helper, a callback: where the source cannot tell, the run tells
        signatures.check_metric_is_logged(cfg)
        return
    with pytest.raises(ConfigError) as error:
        signatures.check_metric_is_logged(cfg)
    assert str(error.value) == (
        "optimized_metric=val/f1 is logged nowhere: fakemetrics.Logs logs val/mse (its self.log calls); set "
        "optimized_metric to one of those (optimized_metric=null for a module that logs none)"
    )
