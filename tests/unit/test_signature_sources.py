"""How ``litlab.config.signatures`` reads a target's keyword arguments from its source (relative
imports, blocks, base classes, decorators, cycles) and where it says a bad key was written, on a
package the test writes and configs built in memory (no composing, no torch)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from litlab.config import signatures
from litlab.config.rules import ConfigError
from litlab.config.signatures import Signature, signature_of

PACKAGE = {
    "__init__.py": """
        from .models import Net
        from . import models as models_module
        try:
            from .models import Fallback
        except ImportError:
            pass
        if True:
            from .sub.deep import Deep
    """,
    "models.py": """
        import collections as coll
        from . import bases
        from .bases import Base as Renamed

        class Net(Renamed):
            pass

        class FromModule(bases.Base):
            pass

        class FromAlias(coll.OrderedDict):
            pass

        class Fallback:
            def __init__(self, a, *, b=1):
                pass

        def plain(x, y=2, **options):
            pass

        def wrap(f):
            return f

        @wrap
        def wrapped(p, q):
            pass

        class InitWrapped:
            @wrap
            def __init__(self, r):
                pass

        class NoInit:
            pass

        built = dict
    """,
    # Read, never imported (it could not be): bases that name each other.
    "loops.py": """
        class Loop(Loop2):
            pass

        class Loop2(Loop):
            pass
    """,
    "bases.py": """
        class Base:
            def __init__(self, width, depth=2):
                pass
    """,
    "typed.py": """
        from typing import Literal, Optional, Union

        def _defaults_from_env_vars(f):  # as Lightning's Trainer has: keeps the signature
            return f

        class Kept:
            @_defaults_from_env_vars
            def __init__(
                self,
                *,
                count: int = 1,
                rate: Optional[float] = None,
                name: "str | None" = "x",
                switch=False,
                other: Union[int, Thing] = 0,
                sizes: list[int] = (),
                mode: Literal["a"] = "a",
                maybe: bool = None,
                free=0,
            ):
                pass

        class NewOnly:
            def __new__(cls, days=0, seconds=0):
                pass
    """,
    "sub/__init__.py": "",
    "sub/deep.py": """
        from ..bases import Base

        class Deep(Base):
            pass
    """,
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    for name, text in PACKAGE.items():
        path = tmp_path / "sigpkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_signatures()
    yield "sigpkg"
    forget_signatures()
    for name in [m for m in sys.modules if m == "sigpkg" or m.startswith("sigpkg.")]:
        del sys.modules[name]


def forget_signatures() -> None:
    """Empty the caches of what was read, so each test reads its own package."""
    for cached in (signatures.signature_of, signatures._module_tree):
        cached.cache_clear()


BASE = Signature(("width", "depth"), False)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("sigpkg.Net", BASE),  # re-exported by a relative import, inherited through a renamed base
        ("sigpkg.models.FromModule", BASE),  # a base named through `from . import bases`
        ("sigpkg.Deep", BASE),  # an import inside `if`, a `from ..` import two levels up
        ("sigpkg.Fallback", Signature(("a", "b"), False)),  # an import inside `try`
        ("sigpkg.models.plain", Signature(("x", "y"), True)),
        ("sigpkg.models.NoInit", Signature((), False)),  # object's, imported
    ],
)
def test_a_signature_is_read_from_source_without_importing_the_target(package, target, expected):
    assert signature_of(target) == expected
    if target != "sigpkg.models.NoInit":
        assert "sigpkg.models" not in sys.modules


def test_a_decorated_target_is_imported_and_inspected(package):
    assert signatures._from_source("sigpkg.models", "wrapped", 0) is None
    assert signature_of("sigpkg.models.wrapped") == Signature(("p", "q"), False)
    assert signatures._from_source("sigpkg.models", "InitWrapped", 0) is None
    assert signature_of("sigpkg.models.InitWrapped") == Signature(("r",), False)
    assert "sigpkg.models" in sys.modules


def test_a_signature_keeping_decorator_and_new_are_read_with_their_plain_types(package):
    kept = signature_of("sigpkg.typed.Kept")
    assert kept.names == ("count", "rate", "name", "switch", "other", "sizes", "mode", "maybe", "free")
    none = type(None)
    assert kept.types == {
        "count": {int},
        "rate": {float, none},
        "name": {str, none},  # a quoted annotation
        "switch": {bool},  # no annotation, a bool default: a switch
        "sizes": {list},  # the items are not checked
        "maybe": {bool, none},  # a None default allows None
    }  # other (a class in the union), mode (Literal) and free: not checked
    assert signature_of("sigpkg.typed.NewOnly").names == ("days", "seconds")
    assert "sigpkg.typed" not in sys.modules


@pytest.mark.parametrize(
    ("allowed", "value", "accepted"),
    [
        ({int}, 3, True),
        ({int}, True, False),  # a bool is an int to Python, not to a config
        ({int}, 1.5, False),
        ({float}, 2, True),
        ({bool}, 1, False),
        ({str}, 3, False),
        ({tuple}, [1, 2], True),  # a YAML list for a tuple
        ({dict}, {"a": 1}, True),
        ({int, type(None)}, None, True),
        ({int}, None, False),
    ],
)
def test_a_value_is_checked_against_the_plain_types_of_its_annotation(allowed, value, accepted):
    assert signatures._type_allows(frozenset(allowed), value) is accepted


def test_an_imported_target_with_var_keywords_accepts_any_key(package):
    assert signatures._from_import("sigpkg.models", "plain") == Signature(("x", "y"), True)
    assert signatures._from_import("sigpkg.bases", "Base") == BASE


def test_bases_through_cycles_or_outside_python_source_end_without_an_answer(package):
    assert signatures._from_source("sigpkg.loops", "Loop", 0) is None  # depth-limited, not endless
    # A base through `import collections as coll`: read from collections/__init__.py
    assert signatures._from_source("sigpkg.models", "FromAlias", 0) == Signature((), True)
    assert signatures._from_source("sigpkg.models", "built", 0) is None  # an assignment
    assert signatures._from_source("sigpkg.models", "absent", 0) is None
    assert signatures._from_source("sigpkg.models", "Net", 10) is None


def test_a_module_that_cannot_be_found_has_no_tree(package):
    assert signatures._module_tree("no_such_package_anywhere") is None
    assert signatures._module_tree("sigpkg.no_such_module") is None
    assert signatures._module_tree("sys") is None  # built in: no source
    tree, is_package = signatures._module_tree("sigpkg")
    assert is_package and not signatures._module_tree("sigpkg.models")[1]


def test_a_target_without_a_module_or_signature_is_not_checked():
    assert signature_of("len") is None
    assert signatures._from_import("math", "hypot") is None  # a builtin without a signature


def test_a_target_that_does_not_exist_raises(package):
    with pytest.raises(AttributeError):
        signature_of("sigpkg.models.Absent")
    with pytest.raises(ImportError):
        signature_of("no_such_package_anywhere.Thing")


def test_relative_imports_resolve_against_the_package():
    import ast

    (statement,) = ast.parse("from ..x import y").body
    assert signatures.imported_module("a.b.c", False, statement) == "a.x"
    assert signatures.imported_module("a.b", True, statement) == "a.x"
    (statement,) = ast.parse("from . import y").body
    assert signatures.imported_module("a.b", False, statement) == "a"
    (statement,) = ast.parse("from ... import y").body
    assert signatures.imported_module("a.b", False, statement) is None
    (statement,) = ast.parse("from x.y import z").body
    assert signatures.imported_module("a.b", False, statement) == "x.y"


# --- check: which nodes, which keys, and where the message says the key was written -----------


def config(**nodes):
    return OmegaConf.create(nodes)


def failure(cfg, overrides=(), config_dirs=()) -> str:
    with pytest.raises(ConfigError) as raised:
        signatures.check(cfg, list(overrides), list(config_dirs))
    return str(raised.value)


def test_an_unknown_key_names_the_target_and_what_it_accepts(package):
    cfg = config(model={"_target_": "sigpkg.Net", "width": 2, "widht": 3})
    assert failure(cfg) == "unknown key 'model.widht' : sigpkg.Net accepts width, depth"
    cfg = config(model={"_target_": "sigpkg.models.NoInit", "x": 1})
    assert failure(cfg).endswith("sigpkg.models.NoInit accepts no arguments")


def test_nested_and_listed_nodes_are_checked_where_they_are(package):
    cfg = config(model={"_target_": "sigpkg.models.plain", "parts": [{"_target_": "sigpkg.Net", "bad": 1}]})
    assert failure(cfg).startswith("unknown key 'model.parts.0.bad'")
    cfg = config(
        callbacks={"a": {"_target_": "sigpkg.models.plain", "nested": {"_target_": "sigpkg.Net", "bad": 1}}}
    )
    assert failure(cfg).startswith("unknown key 'callbacks.a.nested.bad'")


def test_what_the_check_leaves_alone(package):
    fine = {
        "model": {"_target_": "sigpkg.Net", "width": 1, "_partial_": True, "_recursive_": False},
        "data": {"_target_": "sigpkg.Net", "width": 1},
        "optimizer": {"_target_": "sigpkg.models.plain", "anything": 1},  # **options
        "other": {"_target_": "len", "x": 1},  # no module: no signature
        "empty": {"_target_": "", "x": 1},
        "number": {"_target_": 3, "x": 1},
        "oom": {"_target_": "sigpkg.Net", "x": 1},  # a schema group: checked by its schema
        "hydra": {"_target_": "sigpkg.Net", "x": 1},
        "alias": "${model}",  # checked where it is defined
        "later": "???",
        "model_ref": {"net": "${model}", "missing": "???"},
        "scalar": 3,
    }
    signatures.check(config(**fine), [], [])
    with pytest.raises(ConfigError):  # no engine key hides in your groups: data is checked as any other
        signatures.check(config(data={"_target_": "sigpkg.Net", "global_batch_size": 8}), [], [])


def test_nodes_after_a_skipped_one_are_still_checked(package):
    for skipped in ({"_target_": "", "x": 1}, {"_target_": 3}, "${model}", "???"):
        cfg = config(first={"a": skipped, "b": {"_target_": "sigpkg.Net", "bad": 1}})
        assert failure(cfg).startswith("unknown key 'first.b.bad'"), skipped
    cfg = config(empty={"_target_": "", "x": 1}, model={"_target_": "sigpkg.Net", "bad": 1})
    assert failure(cfg).startswith("unknown key 'model.bad'")


def test_a_target_that_cannot_be_imported_is_named_where_it_was_written(package, config_dirs):
    cfg = with_choices(config(model={"_target_": "sigpkg.models.Absent"}), model="small")
    where = f"in {signatures._shown(config_dirs)}/model/small.yaml"
    assert failure(cfg, [], [config_dirs]).startswith(f"model._target_=sigpkg.models.Absent {where} cannot")


def test_a_target_that_cannot_be_imported_is_named_with_its_error(package):
    message = failure(config(model={"_target_": "sigpkg.models.Absent"}), ["model._target_=x"])
    assert message.startswith("model._target_=sigpkg.models.Absent on the command line cannot be imported (")
    assert message.endswith("): check the module and class name")
    message = failure(config(model={"_target_": "no_such_package_anywhere.Thing"}))
    assert "(ModuleNotFoundError: No module named 'no_such_package_anywhere')" in message


@pytest.fixture
def config_dirs(tmp_path) -> Path:
    root = tmp_path / "configs"
    for name, text in {
        "model/small.yaml": "width: 1\n",
        "experiment/tuned.yaml": "model:\n  widht: 3\n",
        "experiment/other.yaml": "data:\n  x: 1\n",
        "debug/broken.yaml": "a: [\n",
        "experiment/unresolved.yaml": "model:\n  widht: ${absent}\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def with_choices(cfg, **choices):
    cfg.hydra = {"runtime": {"choices": choices}}
    return cfg


@pytest.mark.parametrize(
    ("overrides", "choices", "where"),
    [
        (["model.widht=3"], {"model": "small"}, "on the command line"),
        (["+model.widht=3"], {"model": "small"}, "on the command line"),
        (["model=small"], {"model": "small", "experiment": "tuned"}, "in {dir}/experiment/tuned.yaml"),
        (["model.width=1"], {"model": "small", "experiment": "other"}, "in {dir}/model/small.yaml"),
        ([], {"model": "small", "debug": "broken"}, "in {dir}/model/small.yaml"),
        ([], {"model": "small", "experiment": "unresolved"}, "in {dir}/model/small.yaml"),
        ([], {"model": "gone"}, "in model=gone"),
        ([], {}, ""),
    ],
)
def test_the_message_says_where_the_key_was_written(package, config_dirs, overrides, choices, where):
    cfg = with_choices(config(model={"_target_": "sigpkg.Net", "widht": 3}), **choices)
    where = where.format(dir=signatures._shown(config_dirs))
    assert (
        failure(cfg, overrides, [config_dirs])
        == f"unknown key 'model.widht' {where}: sigpkg.Net accepts width, depth"
    )


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        (["model.net={widht: 3}"], "on the command line"),  # the key's parent written whole
        (["model.net.widht=a=b"], "on the command line"),  # a value with '=' in it
        (["model.netx=1"], "in {dir}/model/small.yaml"),  # a sibling whose name starts the same
        ([], "in {dir}/model/small.yaml"),  # a nested key is in its group's file
    ],
)
def test_a_nested_key_is_placed_by_its_parents_and_its_group(package, config_dirs, overrides, where):
    cfg = with_choices(config(model={"net": {"_target_": "sigpkg.Net", "widht": 3}}), model="small")
    where = where.format(dir=signatures._shown(config_dirs))
    assert failure(cfg, overrides, [config_dirs]).startswith(f"unknown key 'model.net.widht' {where}: ")


def test_paths_are_shown_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert signatures._shown(tmp_path / "configs" / "a.yaml") == "configs/a.yaml"
    assert signatures._shown(Path("/elsewhere/a.yaml")) == "/elsewhere/a.yaml"
