"""Your groups' keys are checked against their ``_target_``'s signature, read from source when it can be.

Targets in a package written by the test: its modules import something that does not exist, so
reading a signature by importing them would fail; the AST path must not import them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import open_dict

from litlab.config import signatures
from litlab.config.preflight import CONFIG_DIR
from litlab.config.rules import ConfigError
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
        signatures.check(cfg, ["model=mlp"], [CONFIG_DIR])
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
        signatures.check(cfg, ["+optimizer.lrr=0.1"], [CONFIG_DIR])


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
    signatures.check(compose_train(overrides, tmp_path), overrides, [CONFIG_DIR])


def test_a_typo_in_your_group_fails_without_importing_torch_or_your_code():
    code = textwrap.dedent(
        """
        import sys
        sys.argv = ["litlab-train", "+model.net.hiden=3"]
        from litlab.cli.train import main
        try:
            main()
        except SystemExit as exit:
            loaded = ("torch", "lightning", "project.vision.nets")
            print(exit.code, sorted(m for m in loaded if m in sys.modules))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.stdout.split(None, 1) == ["2", "[]\n"], result.stdout + result.stderr
    assert (
        "unknown key 'model.net.hiden' on the command line: project.vision.nets.CNN accepts" in result.stderr
    )
