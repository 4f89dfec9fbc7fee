"""What litlab writes and logs of a config holds no credentials (``litlab.config.redact``), while the
run itself resolves every value as before. (tests/integration/test_secrets.py searches every byte a
real run, a sweep and an MLflow server with basic auth keep.)"""

from __future__ import annotations

import json
import os

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from lightning.pytorch.utilities.parsing import AttributeDict
from omegaconf import OmegaConf

from litlab.config.redact import (
    REDACTED,
    Redaction,
    is_credential_key,
    move_typed_secrets,
    redact,
    redact_command,
    redact_hydra_record,
    redact_overrides,
    redact_summary,
    redact_text,
    typed_overrides,
    unresolvable,
    url_without_userinfo,
    walk,
)
from litlab.run.loggers import credential_arguments
from litlab.run.summary import Summary
from litlab.storage.checkpoints import RUN_CONFIG_KEY, RunConfigInCheckpoint
from tests.conftest import compose_train

SECRET = "s3cr3t-Pa55"  # in no config text: only ever in the environment


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("LITLAB_TEST_TOKEN", SECRET)
    monkeypatch.setenv("LITLAB_TEST_URI", f"http://alice:{SECRET}@127.0.0.1:5999")
    monkeypatch.delenv("LITLAB_TEST_UNSET", raising=False)


def everything_written(value) -> str:
    return json.dumps(value, default=str)


def test_a_value_from_the_environment_is_written_as_its_interpolation_and_still_used(secret_env):
    cfg = OmegaConf.create(
        {
            "service": {"url": "${oc.env:LITLAB_TEST_URI}", "header": "Bearer ${oc.env:LITLAB_TEST_TOKEN}"},
            "endpoint": "${service.url}/api",  # through another key that came from the environment
            "copy": "${service}",  # a whole group that holds one
            "fallback": "${oc.env:LITLAB_TEST_UNSET,local}",  # a default: still the interpolation
            "plain": "${fallback}-not-secret",
            "name": "run",
            "greeting": "${name}-1",  # no environment involved: resolved as usual
        }
    )
    written = redact(cfg)
    assert written == {
        "service": {"url": "${oc.env:LITLAB_TEST_URI}", "header": "Bearer ${oc.env:LITLAB_TEST_TOKEN}"},
        "endpoint": "${service.url}/api",
        "copy": "${service}",
        "fallback": "${oc.env:LITLAB_TEST_UNSET,local}",
        "plain": "${fallback}-not-secret",
        "name": "run",
        "greeting": "run-1",
    }
    assert SECRET not in everything_written(written)
    # The run itself: unchanged, and the config it uses is not modified.
    assert cfg.service.header == f"Bearer {SECRET}"
    assert cfg.endpoint == f"http://alice:{SECRET}@127.0.0.1:5999/api"
    assert cfg["copy"].url == f"http://alice:{SECRET}@127.0.0.1:5999"
    assert cfg.fallback == "local"


def test_the_written_config_resolves_again_in_an_environment_that_has_the_values(secret_env):
    cfg = OmegaConf.create({"data": {"header": "Bearer ${oc.env:LITLAB_TEST_TOKEN}", "root": "/d"}})
    again = OmegaConf.create(redact(cfg))
    assert unresolvable(again, ("data",)) is None
    assert again.data.header == f"Bearer {SECRET}"


@pytest.mark.parametrize(
    "url, written",
    [
        ("http://alice:pw@127.0.0.1:5000", "http://***@127.0.0.1:5000"),
        ("https://token@host.example/path?q=1", "https://***@host.example/path?q=1"),
        ("postgresql+psycopg://u:p%40ss@db:5432/optuna", "postgresql+psycopg://***@db:5432/optuna"),
        ("postgresql://me@db/optuna", "postgresql://me@db/optuna"),  # a database's user alone: no secret
        ("see http://a:b@h1/x and s3://k:s@bucket/y", "see http://***@h1/x and s3://***@bucket/y"),
        ("s3://bucket/key@v1", "s3://bucket/key@v1"),  # an "@" in the path is not user-info
        ("http://host:80/p?mail=a@b.c", "http://host:80/p?mail=a@b.c"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),  # not a URL with a scheme
        ("sqlite:////tmp/logs/mlflow.db", "sqlite:////tmp/logs/mlflow.db"),
    ],
)
def test_the_user_info_of_any_url_is_replaced(url, written):
    assert redact_text(url) == written
    assert redact(OmegaConf.create({"deep": {"list": [url]}})) == {"deep": {"list": [written]}}


@pytest.mark.parametrize(
    "key",
    [
        "password", "DB_PASSWORD", "passwd", "secret", "aws_secret_access_key", "clientSecret",
        "token", "hf_token", "authToken", "github-token", "api_key", "apiKey", "OPENAI_API_KEY",
        "apikey", "access_key", "accessKey", "aws_access_key_id", "credential", "credentials",
        "my_token_file",
    ],
)  # fmt: skip
def test_keys_that_name_a_credential(key):
    assert is_credential_key(key)


@pytest.mark.parametrize(
    "key",
    ["max_tokens", "tokenizer", "num_tokens", "tokens_per_second", "key", "monkey", "batch_size", "path"],
)
def test_keys_that_do_not(key):
    assert not is_credential_key(key)


def test_the_value_of_a_credential_key_is_redacted_in_any_group(secret_env):
    cfg = OmegaConf.create(
        {
            "storage": {"options": {"secret": "literal-in-a-file", "key": "not-a-credential-name"}},
            "model": {"hub": {"api_key": "${oc.env:LITLAB_TEST_TOKEN}"}},  # exactly an env reference
            "data": {"password": "${oc.env:LITLAB_TEST_UNSET,fallback-pw}"},  # a default could be one
            "logger": {"x": {"credentials": {"user": "u", "pass": "p"}}, "y": {"token": None}},
        }
    )
    assert redact(cfg) == {
        "storage": {"options": {"secret": REDACTED, "key": "not-a-credential-name"}},
        "model": {"hub": {"api_key": "${oc.env:LITLAB_TEST_TOKEN}"}},  # no secret, and resolvable again
        "data": {"password": REDACTED},
        "logger": {"x": {"credentials": REDACTED}, "y": {"token": None}},
    }


def test_a_composed_train_config_with_credentials_in_the_environment(tmp_path, secret_env, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{SECRET}@127.0.0.1:5999")
    cfg = compose_train(["logger=many", "+data.service_token=${oc.env:LITLAB_TEST_TOKEN}"], tmp_path)
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # what the task function gets
    written = redact(cfg)
    assert SECRET not in OmegaConf.to_yaml(written)
    assert written["logger"]["mlflow"]["tracking_uri"].startswith("${oc.env:MLFLOW_TRACKING_URI,")
    assert written["data"]["service_token"] == "${oc.env:LITLAB_TEST_TOKEN}"
    assert cfg.logger.mlflow.tracking_uri == f"http://alice:{SECRET}@127.0.0.1:5999"  # what the run uses
    # Only what depends on the environment differs from the resolved config.
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert written["logger"]["csv"] == resolved["logger"]["csv"]
    assert written["trainer"] == resolved["trainer"] and written["model"] == resolved["model"]


def test_mlflow_gets_the_tracking_uri_without_user_info_and_the_credentials_in_its_environment(
    monkeypatch,
):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")  # recorded, so what credential_arguments sets is undone afterwards
        monkeypatch.delenv(name)
    logger_cfg = OmegaConf.create(
        {"_target_": "lightning.pytorch.loggers.MLFlowLogger", "tracking_uri": "http://al%40ice:p%3Aw@h:5/x"}
    )
    assert credential_arguments(logger_cfg) == {"tracking_uri": "http://h:5/x"}
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == (
        "al@ice",
        "p:w",
    )
    # Variables already set win, as they do in MLflow's own client; an empty one counts as none there.
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-env")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "")
    credential_arguments(logger_cfg)
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == (
        "al@ice",
        "from-env",
    )
    # No user-info, or another logger: nothing changes.
    assert credential_arguments(OmegaConf.create({**logger_cfg, "tracking_uri": "sqlite:///x.db"})) == {}
    assert (
        credential_arguments(OmegaConf.create({"_target_": "x.CSVLogger", "tracking_uri": "http://a:b@h"}))
        == {}
    )
    assert url_without_userinfo("http://token@h") == ("http://h", "token", None)


def test_overrides_and_commands_as_written():
    typed = [
        "+data.api_key=abc123",
        "+data.hf_token=${oc.env:HF_TOKEN}",
        "logger.mlflow.tracking_uri=http://a:b@h:5000",
        "++storage.options.secret='x y'",
        "trainer.max_epochs=2",
        "model=mlp",
    ]
    assert redact_overrides(typed) == [
        "+data.api_key=***",
        "+data.hf_token=${oc.env:HF_TOKEN}",
        "logger.mlflow.tracking_uri=http://***@h:5000",
        "++storage.options.secret=***",
        "trainer.max_epochs=2",
        "model=mlp",
    ]
    assert redact_command(["python", "-m", "litlab.cli.train", "+x.password=pw"]) == [
        "python", "-m", "litlab.cli.train", "+x.password=***",
    ]  # fmt: skip
    assert redact_command("python -m litlab.cli.train '+x.token=a b' hydra.run.dir=/r") == (
        "python -m litlab.cli.train '+x.token=***' hydra.run.dir=/r"
    )


def test_hydras_record_of_the_overrides_is_read_as_typed_not_resolved(secret_env):
    recorded = OmegaConf.create({"task": ["+data.header=Bearer-${oc.env:LITLAB_TEST_TOKEN}"]}).task
    assert list(recorded) == [f"+data.header=Bearer-{SECRET}"]  # what iterating it does
    assert typed_overrides(recorded) == ["+data.header=Bearer-${oc.env:LITLAB_TEST_TOKEN}"]
    assert typed_overrides(["a=1"]) == ["a=1"]


def test_a_written_summary_holds_no_credentials(tmp_path):
    summary = Summary(
        status="failed",
        error="MlflowException: cannot reach http://alice:pw@127.0.0.1:5999/api",
        overrides=["+data.password=pw", "logger.mlflow.tracking_uri=http://alice:pw@h"],
        sweep={"dir": "/s", "job_num": 0, "command": "python -m litlab.cli.train +x.secret=pw"},
        metrics={"train/tokens_per_second": 1.0},  # a metric is not a credential
    )
    text = summary.to_json()
    assert ":pw" not in text and "=pw" not in text
    written = json.loads(text)
    assert written["overrides"] == ["+data.password=***", "logger.mlflow.tracking_uri=http://***@h"]
    assert written["sweep"]["command"] == "python -m litlab.cli.train '+x.secret=***'"  # shell-quoted
    assert written["error"] == "MlflowException: cannot reach http://***@127.0.0.1:5999/api"
    assert written["metrics"] == {"train/tokens_per_second": 1.0}
    assert summary.overrides[0] == "+data.password=pw"  # the summary in memory is not changed
    assert redact_summary({"overrides": None, "sweep": None}) == {"overrides": [], "sweep": None}


def test_a_modules_saved_hyperparameters_are_redacted_where_they_are_logged_and_checkpointed(secret_env):
    cfg = OmegaConf.create(
        {"data": {"token": "${oc.env:LITLAB_TEST_TOKEN}", "header": "Bearer-${oc.env:LITLAB_TEST_TOKEN}"}}
    )
    redaction = Redaction.of(cfg)
    saved = AttributeDict(  # what save_hyperparameters recorded: the values the datamodule got
        token=SECRET, header=f"Bearer-{SECRET}", url=f"http://a:{SECRET}@h", nested={"apiKey": "k"}, size=3
    )
    logged = redaction.values(saved)
    assert isinstance(logged, AttributeDict)
    assert logged == {
        "token": "${oc.env:LITLAB_TEST_TOKEN}",
        "header": "Bearer-${oc.env:LITLAB_TEST_TOKEN}",
        "url": "http://***@h",
        "nested": {"apiKey": REDACTED},
        "size": 3,
    }
    stored = RunConfigInCheckpoint(redaction.config, {"data": "digits"}, redact_values=redaction.values)
    checkpoint = {"hyper_parameters": dict(saved), "datamodule_hyper_parameters": {"password": "pw"}}
    stored.on_save_checkpoint(None, None, checkpoint)
    assert SECRET not in everything_written(checkpoint)
    assert checkpoint[RUN_CONFIG_KEY]["config"] == redaction.config
    assert checkpoint["datamodule_hyper_parameters"] == {"password": REDACTED}
    # What is redacted stays so when redacted again (the loggers redact the redacted config litlab logs).
    assert redaction.values(redaction.config) == redaction.config
    assert redaction.values(logged) == logged


def test_evaluation_names_a_value_it_cannot_resolve_again(monkeypatch):
    monkeypatch.delenv("LITLAB_TEST_UNSET", raising=False)
    stored = OmegaConf.create(
        {
            "data": {"root": "/d", "token": "${oc.env:LITLAB_TEST_UNSET}"},
            "model": {"api_key": REDACTED, "hub": "https://***@hub.example"},
            "precision": {"value": "32-true"},
        }
    )
    problem = unresolvable(stored, ("data", "model", "precision"))
    assert problem == (
        "data.token is stored as ${oc.env:LITLAB_TEST_UNSET} (a value from the environment is not written "
        "into checkpoints) and cannot be resolved here (Environment variable 'LITLAB_TEST_UNSET' not found): "
        "set it in this environment"
    )
    monkeypatch.setenv("LITLAB_TEST_UNSET", "now-set")
    problem = unresolvable(stored, ("data", "model", "precision"))
    assert problem.startswith("model.api_key was redacted to *** when the checkpoint was written")
    del stored.model.api_key
    assert unresolvable(stored, ("model",)).startswith("model.hub was redacted to https://***@hub.example")
    # A checkpoint written before redaction: plain values, which resolve as they are.
    assert (
        unresolvable(OmegaConf.create({"data": {"root": "/d"}, "model": {"n": 1}}), ("data", "model")) is None
    )


def test_a_credential_typed_on_the_command_line_is_redacted_in_hydras_record(tmp_path):
    hydra_dir = tmp_path / ".hydra"
    hydra_dir.mkdir()
    typed = ["logger.mlflow.tracking_uri=http://alice:pw@h:5000", "+data.api_key=lit", "model=mlp"]
    OmegaConf.save(
        OmegaConf.create(
            {
                "logger": {"mlflow": {"tracking_uri": "http://alice:pw@h:5000"}},
                "data": {"api_key": "lit", "token": "${oc.env:HF_TOKEN}", "root": "${paths.data}"},
            }
        ),
        hydra_dir / "config.yaml",
    )
    OmegaConf.save(OmegaConf.create(typed), hydra_dir / "overrides.yaml")
    hydra = {"hydra": {"overrides": {"task": typed}, "job": {"override_dirname": ",".join(typed)}}}
    OmegaConf.save(OmegaConf.create(hydra), hydra_dir / "hydra.yaml")
    assert redact_hydra_record(tmp_path) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert OmegaConf.to_container(OmegaConf.load(hydra_dir / "config.yaml")) == {
        "logger": {"mlflow": {"tracking_uri": "http://***@h:5000"}},
        "data": {"api_key": REDACTED, "token": "${oc.env:HF_TOKEN}", "root": "${paths.data}"},
    }
    written = ["logger.mlflow.tracking_uri=http://***@h:5000", "+data.api_key=***", "model=mlp"]
    assert list(OmegaConf.load(hydra_dir / "overrides.yaml")) == written
    recorded = OmegaConf.load(hydra_dir / "hydra.yaml").hydra
    assert list(recorded.overrides.task) == written and recorded.job.override_dirname == ",".join(written)
    # Nothing to redact: no file is rewritten.
    assert redact_hydra_record(tmp_path) == []


def test_overrides_as_hydra_escapes_them_are_redacted_too():
    """Hydra writes a sweep job's overrides escaped (.hydra/, multirun.yaml, child commands):
    ``http://alice:pw@h`` is ``http\\://alice\\:pw@h`` there, and a plain URL rule misses it."""
    escaped = [
        r"+logger.csv.prefix=http\://alice\:pw@example.com/",
        r"logger.mlflow.tracking_uri=http\://alice\:pw@h\:5000",
        r"+data.api_key=a\,b",  # one value with an escaped comma
        "seed=1",
    ]
    assert redact_overrides(escaped) == [
        r"+logger.csv.prefix=http\://***@example.com/",
        r"logger.mlflow.tracking_uri=http\://***@h\:5000",
        "+data.api_key=***",
        "seed=1",
    ]
    assert redact_text(r"http\://alice\:pw@h") == r"http\://***@h"
    for named in ("http://${oc.env:NAME}@h", r"http\://$\{oc.env\:NAME\}@h"):  # names its variable: kept
        assert redact_text(named) == named
    # Hydra's comma-joined override_dirname, a swept credential's every value, and a sweep of URLs.
    assert walk({"override_dirname": r"+x.password=a,b,seed=1,u=http\://a\:pw@h"}) == {
        "override_dirname": r"+x.password=***,***,seed=1,u=http\://***@h"
    }
    assert walk(["u=http://a:pw@h,http://b:pw2@h"]) == ["u=http://***@h,http://***@h"]
    assert redact_command(["python", r"+x.prefix=http\://a\:pw@h"]) == ["python", r"+x.prefix=http\://***@h"]


def test_a_credential_typed_on_the_command_line_reaches_the_run_through_the_environment(
    tmp_path, monkeypatch
):
    """``CommandLineSecrets`` (a Hydra callback): the overrides and the composed config read a typed
    credential back from a variable of this process's environment, which every job inherits; the
    run resolves the value it was given, and nothing written holds it."""
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the variables it sets end with the test
    typed = [
        "logger=[csv,mlflow]",
        "+logger.csv.prefix=http://alice:pw-1@example.com/",
        r"logger.mlflow.tracking_uri=http\://bob\:pw-2@h\:5000",  # as a sweep's job gets it: escaped
        "+data.api_key=pw-3",
        "+data.token=${oc.env:HOME}",  # from the environment already: as it is
    ]
    cfg = compose_train(typed, tmp_path)
    assert move_typed_secrets(cfg) == {
        "alice:pw-1": "LITLAB_SECRET_LOGGER_CSV_PREFIX",
        "bob:pw-2": "LITLAB_SECRET_LOGGER_MLFLOW_TRACKING_URI",
        "pw-3": "LITLAB_SECRET_DATA_API_KEY",
    }
    assert os.environ["LITLAB_SECRET_LOGGER_MLFLOW_TRACKING_URI"] == "bob:pw-2"
    assert list(typed_overrides(cfg.hydra.overrides.task)) == [
        "logger=[csv,mlflow]",
        "+logger.csv.prefix=http://${oc.env:LITLAB_SECRET_LOGGER_CSV_PREFIX}@example.com/",
        r"logger.mlflow.tracking_uri=http\://${oc.env:LITLAB_SECRET_LOGGER_MLFLOW_TRACKING_URI}@h\:5000",
        "+data.api_key=${oc.env:LITLAB_SECRET_DATA_API_KEY}",
        "+data.token=${oc.env:HOME}",
    ]
    assert list(HydraConfig.get().overrides.task) == list(cfg.hydra.overrides.task)  # where jobs read them
    written = OmegaConf.to_yaml(cfg)  # unresolved, as Hydra writes multirun.yaml and .hydra/
    assert not any(secret in written for secret in ("pw-1", "pw-2", "pw-3"))
    # The run uses the values it was given ...
    assert cfg.logger.csv.prefix == "http://alice:pw-1@example.com/"
    assert cfg.logger.mlflow.tracking_uri == "http://bob:pw-2@h:5000"
    assert cfg.data.api_key == "pw-3"
    # ... and a job composed from the overrides, as the sweep escapes them, does too.
    parsed = OverridesParser.create().parse_overrides(typed_overrides(cfg.hydra.overrides.task))
    job = compose_train([f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed], tmp_path)
    escaped = OmegaConf.to_container(job.hydra.overrides.task)[1]
    assert escaped.startswith(r"+logger.csv.prefix=http\://$\{oc.env\:")  # as a sweep's job gets it
    assert job.logger.csv.prefix == "http://alice:pw-1@example.com/" and job.data.api_key == "pw-3"
    assert move_typed_secrets(job) == {}  # nothing left to move: the same variables serve every job
    # Moving again, from another value under the same key, takes another variable.
    again = compose_train(["+data.api_key=pw-4"], tmp_path)
    assert move_typed_secrets(again) == {"pw-4": "LITLAB_SECRET_DATA_API_KEY_2"}
    assert again.data.api_key == "pw-4" and cfg.data.api_key == "pw-3"
    # A database URL's user name alone (its password from PGPASSWORD, ~/.pgpass) moves nowhere, no warning.
    user_only = compose_train([r"+data.db=postgresql\://me@db\:5432/optuna"], tmp_path)
    assert move_typed_secrets(user_only) == {} and user_only.data.db == "postgresql://me@db:5432/optuna"
