"""``data.augment`` of the in-memory image datasets (digits, synthetic, cifar10): kornia's batch
augmentations on the training device, each sample with its own random draw, repeated by the seed."""

from __future__ import annotations

import pytest
import torch

from litlab.cli import preflight
from litlab.data import TensorBatches
from litlab.run.build import build_datamodule
from project.vision.data import in_turn
from tests.conftest import compose_train

AFFINE_AND_FLIP = (
    "data.augment=[{_target_: kornia.augmentation.RandomAffine, degrees: 30, translate: [0.2, 0.2], p: 1.0},"
    " {_target_: kornia.augmentation.RandomHorizontalFlip}]"
)


def distinct(images: torch.Tensor) -> int:
    return len({tuple(image.flatten().tolist()) for image in images})


def test_each_sample_of_a_batch_gets_its_own_draw_and_the_seed_repeats_them(tmp_path):
    # The digits datamodule as litlab-train builds it from the config, its training split replaced by
    # one image 128 times: whatever differs between two samples of a batch is the augmentation's draw.
    cfg = compose_train(["data=digits", AFFINE_AND_FLIP], tmp_path)
    data = build_datamodule(cfg, cfg.data.batch_size)
    data.setup("fit")
    image = data.splits["train"][0][:1]
    data.splits["train"] = (image.repeat(128, 1, 1, 1), torch.arange(128))

    first, second = (images for images, _ in data.train_dataloader())
    assert first.shape == image.repeat(64, 1, 1, 1).shape
    assert distinct(first) == distinct(second) == 64  # 64 copies of one image, 64 different draws
    assert not any(torch.equal(augmented, image[0]) for augmented in first)  # p=1: every one moved
    # The same seed, the same draws: another loader (a new epoch 0, as a restarted run builds it)...
    again = [images for images, _ in data.train_dataloader()]
    assert torch.equal(again[0], first) and torch.equal(again[1], second)
    # ... and a loader resumed after the first batch continues with the second batch's draws.
    resumed = data.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "consumed": 1})
    (after_resume,) = (images for images, _ in resumed)
    assert torch.equal(after_resume, second)
    # Another epoch draws anew.
    next_epoch = data.train_dataloader()
    next_epoch.set_epoch(1)
    assert not torch.equal(next(iter(next_epoch))[0], first)


def test_two_ranks_draw_differently_for_their_samples():
    # The same image everywhere: rank 0's and rank 1's batch i differ only by their draws.
    from kornia.augmentation import RandomAffine

    images = torch.rand(1, 1, 8, 8).repeat(16, 1, 1, 1)
    transform = in_turn([RandomAffine(degrees=30, p=1.0)])
    ranks = [
        next(
            iter(TensorBatches((images,), 4, shuffle=True, seed=5, transform=transform, rank=r, world_size=2))
        )
        for r in (0, 1)
    ]
    assert distinct(torch.cat([batch for (batch,) in ranks])) == 8


def test_a_torchvision_transform_in_augment_is_refused_in_one_line_with_kornia_named(
    tmp_path, monkeypatch, capsys
):
    # Given a batch, torchvision's random transforms draw once for every sample in it.
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path / "logs"))
    augment = "data.augment=[{_target_: torchvision.transforms.v2.RandomAffine, degrees: 10}]"
    with pytest.raises(SystemExit) as exited:
        preflight.check_or_exit("train", ["data=digits", augment])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "litlab: error: data=digits: data.augment.0=torchvision.transforms.v2.RandomAffine would draw one "
        "set of parameters for the whole batch: use kornia.augmentation entries "
        "(kornia.augmentation.RandomAffine"
    ), line
