"""The example datasets, and the engine's resumable loaders (TensorBatches, ResumableDataLoader)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from torchvision.transforms import v2

from litlab.data import ResumableDataLoader, TensorBatches, WholeGlobalBatches
from project.vision.data import DigitsDataModule, SyntheticDataModule, _digits_table


def test_digits_split_is_deterministic_and_partitions_the_table():
    first, second = (DigitsDataModule(split_seed=3) for _ in range(2))
    first.setup(), second.setup()
    for split in ("train", "val", "test"):
        assert torch.equal(first.splits[split][0], second.splits[split][0])
    sizes = [len(first.splits[s][1]) for s in ("train", "val", "test")]
    assert sum(sizes) == 1797 and sizes[1] == sizes[2] == int(1797 * 0.15)
    # Disjoint and complete: the three splits together hold each row of the table exactly as often as
    # the table does (a sample in two splits would be counted twice). Pixels are standardised, one
    # affine map for all splits: the 17 distinct values left are the grey levels 0..16, in order.
    levels = torch.unique(torch.cat([images.flatten() for images, _ in first.splits.values()]))
    assert len(levels) == 17
    rows = Counter()
    for images, labels in first.splits.values():
        grey = torch.searchsorted(levels, images.flatten(1))
        rows.update(tuple(row) for row in torch.cat([grey, labels[:, None]], dim=1).tolist())
    assert rows == Counter(tuple(row) for row in _digits_table().astype(int).tolist())
    other = DigitsDataModule(split_seed=4)
    other.setup()
    assert not torch.equal(other.splits["val"][0], first.splits["val"][0])  # the seed picks the split


def test_synthetic_data_has_the_asked_shape_and_labels_a_classifier_learns():
    from sklearn.linear_model import LogisticRegression

    data = SyntheticDataModule(image_shape=[3, 16, 12], num_classes=5, num_samples=600)
    data.setup()
    (train_images, train_labels), (val_images, val_labels) = data.splits["train"], data.splits["val"]
    assert train_images.shape[1:] == (3, 16, 12)
    assert set(train_labels.tolist()) == set(range(5))

    def features(images: torch.Tensor):
        return torch.nn.functional.adaptive_avg_pool2d(images, 4).flatten(1).numpy()

    classifier = LogisticRegression(max_iter=2000).fit(features(train_images), train_labels.numpy())
    # Held-out accuracy far above chance (0.2): the labels follow the images.
    assert classifier.score(features(val_images), val_labels.numpy()) > 0.6


def test_loader_resumes_exactly_where_it_stopped():
    images, labels = torch.randn(50, 1, 4, 4), torch.arange(50)
    full = TensorBatches((images, labels), 8, shuffle=True, seed=1)
    full.set_epoch(2)
    expected = [y.tolist() for _, y in full]

    interrupted = TensorBatches((images, labels), 8, shuffle=True, seed=1)
    interrupted.set_epoch(2)
    batches = iter(interrupted)
    seen = [next(batches)[1].tolist() for _ in range(3)]
    state = interrupted.state_dict()

    resumed = TensorBatches((images, labels), 8, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert seen + [y.tolist() for _, y in resumed] == expected

    # A state taken after the epoch's last batch starts the next epoch from its beginning.
    finished = TensorBatches((images, labels), 8, shuffle=True, seed=1)
    finished.load_state_dict({"epoch": 2, "consumed": len(full)})
    assert len(list(finished)) == len(full)


@contextlib.contextmanager
def rank_of(rank: int, world_size: int) -> Iterator[None]:
    """This process as ``rank`` of a ``world_size``-rank process group that communicates nothing
    (torch's fake backend): what a loader reads of the process group, without other processes."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.distributed.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_find_their_share_of_the_epoch_from_the_process_group_without_overlap():
    labels = torch.arange(21)

    def shards(shuffle: bool) -> list[list[int]]:
        seen = []
        for rank in (0, 1):
            with rank_of(rank, 2):
                loader = TensorBatches((torch.zeros(21, 1, 2, 2), labels), 4, shuffle=shuffle)
                seen.append(torch.cat([y for _, y in loader]).tolist())
        return seen

    seen = shards(shuffle=True)
    assert len(seen[0]) == len(seen[1]) == 8  # whole global batches of 2 x 4: 16 of the 21 samples
    assert len(set(seen[0]) | set(seen[1])) == 16
    counted = sorted(shards(shuffle=False)[0] + shards(shuffle=False)[1])
    assert counted == list(range(21))  # evaluation counts every sample exactly once
    explicit = TensorBatches((torch.zeros(21, 1, 2, 2), labels), 4, shuffle=True, rank=1, world_size=2)
    assert torch.cat([y for _, y in explicit]).tolist() == seen[1]
    # ResumableDataLoader, the loader over a Dataset, finds its rank the same way.
    with rank_of(1, 2):
        resumable = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3)
    assert (resumable.sampler.rank, resumable.sampler.num_replicas) == (1, 2)
    assert len(resumable) == 4  # 37 samples: 4 whole global batches of 2 x 4


def optimizer_steps(make_loader, world_size: int, accumulation: int) -> list[list[tuple[int, float]]]:
    """The (sample, its random number) of each optimizer step of an epoch over all ranks, for a global
    batch of 8."""
    micro = 8 // (world_size * accumulation)
    ranks = [list(make_loader(micro, rank, world_size)) for rank in range(world_size)]
    steps = []
    for step in range(len(ranks[0]) // accumulation):
        window = [b for r in ranks for b in r[step * accumulation : (step + 1) * accumulation]]
        pairs = [pair for indices, values in window for pair in zip(indices, values, strict=True)]
        steps.append(sorted((int(i), float(value)) for i, value in pairs))
    return steps


def _tensors(micro: int, rank: int, world_size: int):
    data = torch.arange(37), torch.arange(37.0) ** 0.5  # (sample, a value that goes with it)
    return TensorBatches(data, micro, shuffle=True, seed=3, rank=rank, world_size=world_size)


def _dataset(micro: int, rank: int, world_size: int):
    return ResumableDataLoader(NoisySquares(), micro, shuffle=True, seed=3, rank=rank, world_size=world_size)


@pytest.mark.parametrize("make_loader", [_tensors, _dataset], ids=["tensors", "dataset"])
def test_every_configuration_trains_the_same_samples_in_each_optimizer_step(make_loader, monkeypatch):
    # 37 samples, a global batch of 8: 4 optimizer steps an epoch, the last 5 samples left out,
    # whatever the ranks and the accumulation; a dataset's sample draws its own numbers in each.
    expected = optimizer_steps(make_loader, 1, 1)
    assert len(expected) == 4 and all(len(step) == 8 for step in expected)
    for world_size, accumulation in [(1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]:
        monkeypatch.setattr(WholeGlobalBatches, "accumulation", accumulation)
        assert optimizer_steps(make_loader, world_size, accumulation) == expected, (world_size, accumulation)


def test_augmentation_is_reproducible_and_leaves_the_global_rng_alone():
    images = torch.rand(16, 1, 8, 8)

    def augmented() -> list[torch.Tensor]:
        loader = TensorBatches(
            (images, torch.arange(16)), 4, shuffle=True, seed=5, transform=v2.RandomAffine(20)
        )
        return [x for x, _ in loader]

    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = augmented()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first, augmented(), strict=True))
    plain = [x for x, _ in TensorBatches((images, torch.arange(16)), 4, shuffle=True, seed=5)]
    assert not torch.equal(first[0], plain[0])  # the same batch, transformed


class NoisySquares(torch.utils.data.Dataset):
    """Index i, and a random number drawn when the sample is read (like a random augmentation)."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(torch.rand(()))


def batches(loader, count: int | None = None) -> list[tuple[list[int], list[float]]]:
    out = []
    for indices, noise in loader:
        out.append((indices.tolist(), noise.tolist()))
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2], ids=["in process", "2 workers"])
def test_resumable_dataloader_continues_mid_epoch_with_the_same_samples_and_random_numbers(workers):
    def loader() -> ResumableDataLoader:
        made = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3, num_workers=workers)
        made.sampler.set_epoch(1)  # Lightning sets the epoch before each epoch
        return made

    expected = batches(loader())
    interrupted = loader()
    seen = batches(interrupted, count=3)
    state = interrupted.state_dict()
    resumed = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3, num_workers=workers)
    resumed.load_state_dict(state)  # Lightning restores, iterates, then sets the epoch: as here
    rest = iter(resumed)
    resumed.sampler.set_epoch(1)
    assert seen + batches(rest) == expected
    epoch = [i for indices, _ in expected for i in indices]
    assert len(set(epoch)) == len(epoch) == 36  # 9 whole batches of 4


def test_resumable_dataloader_order_depends_only_on_seed_and_epoch():
    def epoch_order(epoch: int, seed: int = 3) -> list[int]:
        made = ResumableDataLoader(NoisySquares(), batch_size=5, shuffle=True, seed=seed)
        made.sampler.set_epoch(epoch)
        return [i for indices, _ in batches(made) for i in indices]

    assert epoch_order(2) == epoch_order(2)
    assert epoch_order(2) != epoch_order(3) and epoch_order(2) != epoch_order(2, seed=4)
    assert len(set(epoch_order(5))) == 35  # 7 whole batches of 5


def test_resumable_dataloader_position_of_an_earlier_epoch_starts_the_next_one_at_its_first_batch():
    # Saved after epoch 1's 3rd batch (the end of a limit_train_batches=3 epoch), resumed into epoch 2.
    interrupted = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3)
    interrupted.sampler.set_epoch(1)
    batches(interrupted, count=3)
    state = interrupted.state_dict()
    resumed = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = iter(resumed)
    resumed.sampler.set_epoch(2)
    fresh = ResumableDataLoader(NoisySquares(), batch_size=4, shuffle=True, seed=3)
    fresh.sampler.set_epoch(2)
    assert batches(rest) == batches(fresh)


def test_digits_read_from_the_data_file_equal_load_digits(monkeypatch):
    import importlib.util

    import numpy as np
    from sklearn.datasets import load_digits

    from project.vision import data as digits

    fast = digits._digits_table()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as if the file had moved
    fallback = digits._digits_table()
    reference = load_digits()
    assert np.array_equal(fast, fallback)
    assert np.array_equal(fast[:, :-1], reference.data) and np.array_equal(fast[:, -1], reference.target)
