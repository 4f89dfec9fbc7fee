"""Sweep configs, and who started the ranks: decided from the config and the start environment."""

from __future__ import annotations

from types import SimpleNamespace

from hydra.types import RunMode

from tests.conftest import compose_train


def test_sweep_and_search_configs_compose_as_multiruns(tmp_path):
    grid = compose_train(["sweep=precision_accumulation"], tmp_path)
    search = compose_train(["hparams_search=optuna"], tmp_path)
    joblib = compose_train(["hydra/launcher=joblib"], tmp_path)
    assert grid.hydra.mode == RunMode.MULTIRUN and search.hydra.mode == RunMode.MULTIRUN
    assert dict(grid.hydra.sweeper.params) == {
        "precision": "fp32,fp16,bf16",
        "trainer.accumulate_grad_batches": "1,2,4",
    }
    assert search.hydra.sweeper._target_ == "hydra_plugins.litlab_search.OptunaSearch"
    assert search.hydra.sweeper.storage is None  # a SQLite file under storage.root (litlab.launch.search)
    assert set(search.hydra.sweeper.params) == {"optimizer.lr", "data.batch_size"}
    assert joblib.hydra.launcher._target_.endswith("JoblibLauncher")
    assert grid.hydra.callbacks.report._target_ == "litlab.report.callback.SweepReport"
    assert search.hydra.sweeper.direction == "maximize"  # optimized_metric_mode: max
    assert (
        compose_train(
            ["hparams_search=optuna", "optimized_metric_mode=min"], tmp_path
        ).hydra.sweeper.direction
        == "minimize"
    )


def test_the_default_launcher_is_the_device_pool(tmp_path):
    """Every job a process of its own, on a pool of devices: every GPU, one job per device."""
    grid = compose_train(["sweep=precision_accumulation"], tmp_path)
    assert grid.hydra.launcher._target_ == "hydra_plugins.litlab_pool.DevicePoolLauncher"
    assert grid.hydra.launcher.devices is None and grid.hydra.launcher.jobs_per_device == 1
    solo = compose_train(["sweep=precision_accumulation", "hydra.launcher.devices=1"], tmp_path)
    assert solo.hydra.launcher.devices == 1


def test_multiruns_started_in_the_same_second_get_different_directories_listed_in_start_order(
    tmp_path, monkeypatch
):
    # Eight launches within one second, each a few milliseconds after the last: `ls multiruns/` (and
    # sorted()) must list them as they started, whatever their random suffixes are.
    import datetime as dt

    import litlab.config.resolvers

    starts = iter(dt.datetime(2026, 12, 2, 1, 2, 3, 1000 * ms) for ms in (4, 9, 10, 99, 100, 512, 998, 999))

    class StartingClock(dt.datetime):
        @classmethod
        def now(cls, tz=None) -> dt.datetime:
            return next(starts)

    monkeypatch.setattr(litlab.config.resolvers, "dt", SimpleNamespace(datetime=StartingClock))
    dirs = [compose_train([f"paths.log_dir={tmp_path}"], tmp_path).hydra.sweep.dir for _ in range(8)]
    prefix = f"{tmp_path}/train/multiruns/2026-12-02_01-02-03_"
    assert all(d.startswith(prefix) for d in dirs), dirs
    assert len(set(dirs)) == 8 and sorted(dirs) == dirs, dirs
