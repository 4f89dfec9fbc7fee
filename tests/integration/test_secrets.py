"""Credentials never leave the environment: a search (a sweep, an Optuna study and its trial's run)
that logs to an MLflow server with basic auth (``http://admin:<password>@...`` in
``MLFLOW_TRACKING_URI``) and builds its data from a config key interpolating another secret
(``${oc.env:...}``), with ``logger=[csv,mlflow,tensorboard,wandb]``.

Every byte it leaves is searched for both secrets: the sweep and job folders, the storage folder and
every checkpoint, the study, the TensorBoard events, the CSV and W&B files, the MLflow server's store,
artifacts and log, and the commands' stdout and stderr. The trial still authenticates (its MLflow run
exists on the server, which refuses requests without the password), and ``litlab-eval`` on its
checkpoint resolves the token again from its own environment, or says in one line that it cannot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BIN, FAULTS_IMPORTABLE, TINY, litlab, ok
from tests.faults import SERVICE_TOKEN_ENV
from tests.integration.test_loggers import free_port, wait_until_up

pytest.importorskip("mlflow")
pytest.importorskip("flask_wtf")  # mlflow's basic-auth app needs it

PASSWORD = "Mlflow-Pw-4c1d9e7b"  # the server's admin password (its auth app wants 12 characters or more)
TOKEN = "Svc-Token-7a52b0e3"  # the data's service token
SECRETS = (PASSWORD.encode(), TOKEN.encode())
CSV_PASSWORD = "Csv-Pw-61f0d2c8"  # typed on a -m line, in a URL

DATA_FROM_A_SERVICE = [
    "data._target_=tests.faults.DigitsFromAService",
    f"+data.service_token=${{oc.env:{SERVICE_TOKEN_ENV}}}",  # a credential key
    f"+data.service_header=Bearer-${{oc.env:{SERVICE_TOKEN_ENV}}}",  # any key, from the environment
]
LOGGERS = "logger=[csv,mlflow,tensorboard]"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """``mlflow server --app-name basic-auth`` on a free port of 127.0.0.1, admin password PASSWORD;
    yields (its URL without credentials, its folder: store, artifacts, users and log)."""
    folder = tmp_path_factory.mktemp("mlflow-auth")
    port = free_port()
    ini = folder / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\nadmin_username = admin\n"
        f"database_uri = sqlite:///{folder / 'users.db'}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        **os.environ,
        "MLFLOW_ALLOW_FILE_STORE": "true",  # starts in seconds where SQLite's migrations take more
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,  # read once, to create the admin; stored hashed
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-of-this-test",
    }
    command = [
        str(BIN / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", str(folder / "runs"),
        "--default-artifact-root", str(folder / "artifacts"),
    ]  # fmt: skip
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url)
        yield url, folder
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the worker it started
        server.wait(timeout=30)
        log.close()


def credentials_env(url: str) -> dict[str, str]:
    return {
        **FAULTS_IMPORTABLE,  # tests.faults.DigitsFromAService
        "MLFLOW_TRACKING_URI": url.replace("http://", f"http://admin:{PASSWORD}@"),
        SERVICE_TOKEN_ENV: TOKEN,
        "OMP_NUM_THREADS": "1",  # one thread trains fastest beside a server
    }


def files_holding_a_secret(*folders: Path, secrets: tuple[bytes, ...] = SECRETS) -> list[str]:
    """Every file under the folders (links not followed: what they point to is searched where it lies)
    that holds a secret's bytes."""
    found = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = Path(root) / name
                if path.is_file() and not path.is_symlink():
                    data = path.read_bytes()
                    found += [f"{path}: {s.decode()}" for s in secrets if s in data]
    return found


def outputs_holding_a_secret(
    *results: subprocess.CompletedProcess, secrets: tuple[bytes, ...] = SECRETS
) -> list[str]:
    return [
        f"{' '.join(r.args[1:3])}: {s.decode()}"
        for r in results
        for s in secrets
        if s.decode() in r.stdout + r.stderr
    ]


def mlflow_runs(url: str, experiment: str, monkeypatch) -> list:
    """The server's runs of an experiment, read as the admin (through MLflow's own client)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    client = MlflowClient(url)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


@pytest.mark.slow
def test_a_search_writes_logs_and_stores_no_credential_and_its_trial_authenticates_and_evaluates(
    log_dir, auth_server, tmp_path, monkeypatch
):
    """An ``hparams_search=optuna`` multirun of one trial is a sweep, an Optuna study (its trials'
    parameters, user and system attributes) and a run, with every logger: one command writes every
    kind of file that could hold a credential."""
    pytest.importorskip("wandb")
    optuna = pytest.importorskip("optuna")
    url, server_folder = auth_server
    env = credentials_env(url)
    tiny = [t for t in TINY if not t.startswith("logger=")]
    swept = ok(
        litlab(
            "litlab-train",
            "-m",
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=1",
            "logger=[csv,mlflow,tensorboard,wandb]",  # W&B offline: its run files are searched too
            "experiment_name=swept",
            *DATA_FROM_A_SERVICE,
            *tiny,
            env={**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        )
    )
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    run = sweep / "0"
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert list(run.glob("wandb/offline-run-*/run-*.wandb"))
    assert {p.name for p in run.iterdir()} >= {".hydra", "csv", "tensorboard", "summary.json"}
    assert (
        list((run / "tensorboard").glob("events.out.tfevents.*")) and (run / "csv" / "metrics.csv").is_file()
    )
    (checkpoint,) = log_dir.glob("train/runs/*/checkpoints/last.ckpt")

    # litlab-eval resolves the token again from its environment (the datamodule checks it got it) ...
    evaluated = ok(litlab("litlab-eval", f"ckpt_path={checkpoint}", env=env))
    assert "test/acc" in json.loads(next(log_dir.glob("eval/runs/*/eval.json")).read_text())["metrics"]
    # ... or names the value it cannot resolve, in one line.
    without = {k: v for k, v in env.items() if k != SERVICE_TOKEN_ENV}
    refused = litlab("litlab-eval", f"ckpt_path={checkpoint}", env=without)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"litlab: error: ckpt_path={checkpoint}: data.service_token is stored as "
        f"${{oc.env:{SERVICE_TOKEN_ENV}}} (a value from the environment is not written into checkpoints) "
        f"and cannot be resolved here (Environment variable '{SERVICE_TOKEN_ENV}' not found): "
        "set it in this environment"
    )

    assert files_holding_a_secret(log_dir, server_folder) == []  # the study's SQLite file included
    assert outputs_holding_a_secret(swept, evaluated, refused) == []
    job_output = "".join(p.read_text() for p in run.glob("*.log"))
    assert "View run" in swept.stdout + swept.stderr + job_output  # MLflow's own lines: without the password

    # The trial authenticated: its MLflow run is on the server, which refuses a request without the password.
    with pytest.raises(urllib.error.HTTPError) as refused_request:
        urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=swept")
    assert refused_request.value.code == 401
    (logged,) = mlflow_runs(url, "swept", monkeypatch)
    assert logged.data.tags["sweep_job"] == "0" and logged.info.status == "FINISHED"
    params = logged.data.params
    assert params["logger/mlflow/tracking_uri"].startswith("${oc.env:MLFLOW_TRACKING_URI,")
    assert params["data/service_token"] == f"${{oc.env:{SERVICE_TOKEN_ENV}}}"
    assert params["data/service_header"] == f"Bearer-${{oc.env:{SERVICE_TOKEN_ENV}}}"
    assert "final/test/acc" in logged.data.metrics

    # The study: no credential in its trials' parameters or attributes.
    (database,) = log_dir.rglob("optuna/*.db")
    storage = f"sqlite:///{database}"
    (study_summary,) = optuna.study.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=study_summary.study_name, storage=storage)
    assert len(study.trials) == 1
    opened = optuna.storages.get_storage(storage)
    study_id = opened.get_study_id_from_name(study_summary.study_name)
    stored = json.dumps(
        [study.user_attrs, opened.get_study_system_attrs(study_id)]
        + [[t.params, t.user_attrs, t.system_attrs] for t in study.trials],
        default=str,
    )
    assert not any(secret.decode() in stored for secret in SECRETS)

    # A checkpoint written before redaction (its config resolved, secrets and all) still evaluates.
    import torch
    from omegaconf import OmegaConf

    monkeypatch.setenv(SERVICE_TOKEN_ENV, TOKEN)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state["litlab"]["config"] = OmegaConf.to_container(
        OmegaConf.create(state["litlab"]["config"]), resolve=True
    )
    assert state["litlab"]["config"]["data"]["service_token"] == TOKEN
    older = tmp_path / "before-redaction" / "last.ckpt"
    older.parent.mkdir()
    torch.save(state, older)
    ok(litlab("litlab-eval", f"ckpt_path={older}", env=env))


@pytest.mark.slow
def test_a_password_typed_on_a_multirun_line_reaches_no_file_and_its_jobs_still_authenticate(
    log_dir, auth_server, monkeypatch
):
    """``-m seed=1,2`` with URLs' user-info typed on the line: MLflow's tracking URI (with the server's
    admin password) and a CSV logger's metric prefix. A sweep writes its overrides as Hydra escapes
    them (``http\\://admin\\:<password>@host``: multirun.yaml, each job's .hydra/, command.sh and
    summary.json). Every byte under the sweep folder, the run folders, storage and the MLflow server's
    store is searched for both passwords, and each job still authenticated with the typed one."""
    url, server_folder = auth_server
    typed = (PASSWORD.encode(), CSV_PASSWORD.encode())
    swept = ok(
        litlab(
            "litlab-train",
            "-m",
            "seed=1,2",
            "logger=[csv,mlflow]",
            "experiment_name=typed",
            "logger.mlflow.tracking_uri=" + url.replace("http://", f"http://admin:{PASSWORD}@"),
            f"+logger.csv.prefix=http://alice:{CSV_PASSWORD}@example.com/",
            *[t for t in TINY if not t.startswith("logger=")],
            env={"OMP_NUM_THREADS": "1"},
        )
    )
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    assert (sweep / "multirun.yaml").is_file()
    for job in (sweep / "0", sweep / "1"):  # links to the runs' folders, searched where they lie
        assert json.loads((job / "summary.json").read_text())["status"] == "completed"
        assert {"command.sh", ".hydra", "csv"} <= {p.name for p in job.iterdir()}
        header = (job / "csv" / "metrics.csv").read_text().splitlines()[0]
        assert "http://***@example.com/-" in header  # the prefix, as the run used it, less its password
    assert list(log_dir.glob("train/runs/*/checkpoints/last.ckpt"))  # storage: under log_dir here
    assert files_holding_a_secret(log_dir, server_folder, secrets=typed) == []
    assert outputs_holding_a_secret(swept, secrets=typed) == []
    # Each job authenticated: its MLflow run is on the server, which refuses requests without the password.
    logged = mlflow_runs(url, "typed", monkeypatch)
    assert sorted(run.data.tags["sweep_job"] for run in logged) == ["0", "1"]
    assert all(run.info.status == "FINISHED" for run in logged)
