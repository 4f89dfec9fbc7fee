"""A real S3-speaking HTTP server on 127.0.0.1 for the tests: moto's standalone ``moto_server``.

Authentication is switched on (moto accepts any key otherwise), with one IAM user allowed ``s3:*``,
so that wrong credentials are refused as a real S3 would refuse them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    pid: int  # the server's process (tests stop it with SIGSTOP)
    name = "s3"
    scheme = "s3"

    @property
    def secrets(self) -> list[str]:
        """What must appear in no byte a litlab process writes: the credentials env() gives it."""
        return [self.access_key, self.secret_key]

    def storage(self, bucket: str, prefix: str) -> list[str]:
        """The litlab overrides that store a run under ``s3://bucket/prefix`` on this server."""
        return ["storage=s3", f"storage.root=s3://{bucket}/{prefix}", f"storage.endpoint_url={self.endpoint}"]

    def env(self) -> dict[str, str]:
        """Environment of a litlab process that uses this server (credentials only from here)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": os.devnull,  # nothing from this machine's ~/.aws
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of the bucket: key -> contents."""
        client = self.client()
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    """Until a GET of ``url`` answers; raises if the server's ``process`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with status {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:  # an answer all the same (Azurite: 400, no account in the URL)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{process.args[0]} did not answer on {url} within {timeout} s")


def stop(process: subprocess.Popen) -> None:
    """Stop a server started for the tests: SIGTERM, then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _enable_authentication(url: str) -> tuple[str, str]:
    """Create an IAM user allowed s3:*, then make moto check every request's credentials."""
    import boto3

    admin = {
        "endpoint_url": url,
        "region_name": REGION,
        "aws_access_key_id": "x",
        "aws_secret_access_key": "x",
    }
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="litlab")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="litlab", PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="litlab")["AccessKey"]
    request = urllib.request.Request(
        f"{url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=5)
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto_server on a free localhost port for the whole session, stopped (by its PID) afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_up(f"{url}/moto-api/", process)
        access_key, secret_key = _enable_authentication(url)
        yield S3Server(endpoint=url, access_key=access_key, secret_key=secret_key, pid=process.pid)
    finally:
        stop(process)
