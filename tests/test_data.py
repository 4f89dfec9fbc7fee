"""The in-memory datasets and their stateful, rank-sharded batch loader."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from litlab.data.digits import DigitsDataModule
from litlab.data.memory import TensorBatches
from litlab.data.synthetic import SyntheticDataModule


def test_digits_split_is_deterministic_and_disjoint():
    first, second = (DigitsDataModule("digits", [1, 8, 8], 10, split_seed=3) for _ in range(2))
    first.setup(), second.setup()
    for split in ("train", "val", "test"):
        assert torch.equal(first.splits[split][0], second.splits[split][0])
    sizes = [len(first.splits[s][1]) for s in ("train", "val", "test")]
    assert sum(sizes) == 1797 and sizes[1] == sizes[2] == int(1797 * 0.15)


def test_synthetic_data_has_the_asked_shape_and_learnable_labels():
    data = SyntheticDataModule("synthetic", [3, 16, 12], 5, num_samples=300)
    data.setup()
    images, labels = data.splits["train"]
    assert images.shape[1:] == (3, 16, 12)
    assert set(labels.tolist()) <= set(range(5)) and len(set(labels.tolist())) > 1


def test_loader_resumes_exactly_where_it_stopped():
    images, labels = torch.randn(50, 1, 4, 4), torch.arange(50)
    full = TensorBatches(images, labels, 8, shuffle=True, seed=1)
    full.set_epoch(2)
    expected = [y.tolist() for _, y in full]

    interrupted = TensorBatches(images, labels, 8, shuffle=True, seed=1)
    interrupted.set_epoch(2)
    batches = iter(interrupted)
    seen = [next(batches)[1].tolist() for _ in range(3)]
    state = interrupted.state_dict()

    resumed = TensorBatches(images, labels, 8, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert seen + [y.tolist() for _, y in resumed] == expected

    # A state taken after the epoch's last batch starts the next epoch from its beginning.
    finished = TensorBatches(images, labels, 8, shuffle=True, seed=1)
    finished.load_state_dict({"epoch": 2, "consumed": len(full)})
    assert len(list(finished)) == len(full)


def test_ranks_share_the_epoch_without_overlap():
    labels = torch.arange(21)
    shards = [
        TensorBatches(torch.zeros(21, 1, 2, 2), labels, 4, shuffle=True, rank=r, world_size=2) for r in (0, 1)
    ]
    seen = [torch.cat([y for _, y in shard]).tolist() for shard in shards]
    assert len(seen[0]) == len(seen[1]) == 11  # padded to equal steps
    assert set(seen[0]) | set(seen[1]) == set(range(21))
    evaluation = [
        TensorBatches(torch.zeros(21, 1, 2, 2), labels, 4, shuffle=False, rank=r, world_size=2)
        for r in (0, 1)
    ]
    counted = sorted(torch.cat([y for s in evaluation for _, y in s]).tolist())
    assert counted == list(range(21))  # evaluation counts every sample exactly once


def test_augmentation_is_reproducible_and_leaves_the_global_rng_alone():
    images = torch.rand(16, 1, 8, 8)

    def augmented() -> list[torch.Tensor]:
        loader = TensorBatches(
            images, torch.arange(16), 4, shuffle=True, seed=5, transform=v2.RandomAffine(20)
        )
        return [x for x, _ in loader]

    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = augmented()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first, augmented(), strict=True))
    plain = [x for x, _ in TensorBatches(images, torch.arange(16), 4, shuffle=True, seed=5)]
    assert not torch.equal(first[0], plain[0])  # the same batch, transformed
