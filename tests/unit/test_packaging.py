"""pyproject.toml installs without a deprecation warning of its own, and its extras are what the
docs and the dev extra name."""

from __future__ import annotations

import warnings

from setuptools.config.pyprojecttoml import apply_configuration, read_configuration
from setuptools.dist import Distribution

from tests.conftest import REPO


def test_pyproject_applies_without_a_setuptools_warning():
    # What a fresh `pip install -e .` runs first: setuptools reading [project] into a distribution.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distribution = apply_configuration(Distribution(), str(REPO / "pyproject.toml"))
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    assert distribution.metadata.license_expression == "MIT"


def test_the_optional_loggers_are_extras_and_the_tests_get_them():
    extras = read_configuration(str(REPO / "pyproject.toml"))["project"]["optional-dependencies"]
    assert extras["mlflow"][0].startswith("mlflow") and extras["wandb"][0].startswith("wandb")
    (bundle,) = [d for d in extras["dev"] if d.startswith("litlab[")]
    assert {"mlflow", "wandb"} <= set(bundle.removeprefix("litlab[").rstrip("]").split(","))
