"""The char_lm example (src/project/char_lm): its network, vocabulary, data split and metrics.

A whole run of it, its sweep, eval and resume are in tests/integration/test_char_lm.py; one batch of
its configs trains in tests/unit/test_configs.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.nn import functional as F

from litlab.config.rules import ConfigError
from litlab.run.build import check_by_building
from project.char_lm.data import SUBSTITUTE, VOCAB_SIZE, CharCorpus, decode, encode, pydoc_topics
from project.char_lm.module import CharLM
from project.char_lm.nets import CausalTransformer
from tests.conftest import compose_train


def test_changing_a_later_token_never_changes_earlier_logits():
    torch.manual_seed(0)
    net = CausalTransformer(VOCAB_SIZE, block_size=16, layers=2, heads=2, head_width=8).eval()
    tokens = torch.randint(0, VOCAB_SIZE, (3, 16))
    for t in (0, 5, 15):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1) % VOCAB_SIZE
        before, after = net(tokens), net(changed)
        assert torch.allclose(before[:, :t], after[:, :t], atol=1e-6, rtol=0), f"position {t} leaked back"
        # ... while the changed position itself (and what follows) does see the change.
        assert not torch.allclose(before[:, t], after[:, t]), f"position {t} ignores its own token"


def test_vocabulary_round_trips_ascii_and_substitutes_the_rest():
    text = "def f(x):\n\treturn x ** 2  # ~ {ok} \x00\x7f"
    assert decode(encode(text)) == text
    assert encode("naïve “quotes”").tolist() == encode("na\x1ave \x1aquotes\x1a").tolist()
    assert encode("é")[0] == SUBSTITUTE
    corpus = encode(pydoc_topics())
    assert corpus.dtype == torch.int64 and int(corpus.min()) >= 0 and int(corpus.max()) < VOCAB_SIZE
    assert (corpus == SUBSTITUTE).float().mean() < 0.002  # the corpus is nearly all ASCII


def test_pydoc_split_is_deterministic(tmp_path: Path):
    first, second, other = CharCorpus(split_seed=3), CharCorpus(split_seed=3), CharCorpus(split_seed=4)
    for data in (first, second, other):
        data.setup()
    sizes = {split: len(first.splits[split]) for split in ("train", "val", "test")}
    assert sizes["val"] == sizes["test"] == int(sum(sizes.values()) * 0.05) > 0
    assert all(torch.equal(first.splits[s], second.splits[s]) for s in sizes)
    assert not torch.equal(first.splits["val"], other.splits["val"])
    assert first.splits["train"].shape[1] == first.block_size + 1


def test_split_of_your_own_text_file_is_disjoint_and_covers_every_sequence(tmp_path: Path):
    # Every 6-character sequence of this text is unique (its own number), so sequences identify
    # their place in the text.
    text_file = tmp_path / "numbers.txt"
    text_file.write_text("".join(f"{i:06d}" for i in range(400)), encoding="utf-8")
    data = CharCorpus(block_size=5, text_file=str(text_file), val_fraction=0.1, test_fraction=0.2)
    data.setup()
    seen = {split: {decode(row) for row in rows} for split, rows in data.splits.items()}
    assert [len(seen[s]) for s in ("train", "val", "test")] == [280, 40, 80]
    assert not (seen["train"] & seen["val"] or seen["train"] & seen["test"] or seen["val"] & seen["test"])
    assert seen["train"] | seen["val"] | seen["test"] == {f"{i:06d}" for i in range(400)}


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("data.block_size=0", "data.block_size=0"),
        ("data.val_fraction=0.96", "data.val_fraction=0.96"),
        ("data.text_file=/no/such/file.txt", "data.text_file=/no/such/file.txt"),
    ],
)
def test_bad_data_values_fail_the_preflight_naming_the_value(override, named, tmp_path):
    cfg = compose_train(["experiment=char_lm", override], tmp_path)
    with pytest.raises(ConfigError) as error:
        check_by_building(cfg)
    assert named in str(error.value) and "data=pydoc_topics" in str(error.value)


def test_val_loss_is_the_mean_per_character_and_perplexity_its_exponential(tmp_path):
    # 357 validation sequences in batches of 32: the last batch is short, so a mean of batch means
    # would differ from the mean over characters.
    data = CharCorpus(batch_size=32, block_size=64)
    module = CharLM(
        net={"_target_": "project.char_lm.nets.CausalTransformer", "layers": 1, "heads": 2, "head_width": 8},
        optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1},
    )
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    (metrics,) = trainer.validate(module, datamodule=data, verbose=False)
    sequences = data.splits["val"]
    assert len(sequences) % 32 != 0
    with torch.no_grad():
        logits = module(sequences[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), sequences[:, 1:].flatten())
    assert metrics["val/loss"] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["val/perplexity"] == pytest.approx(float(expected.exp()), rel=1e-5)
    assert module.batch_tokens((sequences[:5],)) == 5 * 64

    with torch.no_grad():  # a network that has gone non-finite shows in the metrics
        module.net.head.weight[0, 0] = float("nan")
    (metrics,) = trainer.validate(module, datamodule=data, verbose=False)
    assert math.isnan(metrics["val/loss"]) and math.isnan(metrics["val/perplexity"])
