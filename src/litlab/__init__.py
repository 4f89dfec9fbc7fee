"""litlab: the engine around ``trainer.fit`` -- config checks, run identity, storage and resume,
launchers and sweeps, reports, and the guards -- for any LightningModule and LightningDataModule
that follow its contract (docs/contract.md). Your own code lives in its own package (src/project/).

``litlab.train(["model=mlp"])`` runs ``litlab-train model=mlp`` in this process and returns its summary;
``litlab.compose`` gives its checked config (docs/runs.md, "From Python")."""


def __getattr__(name: str):
    """``litlab.train`` and ``litlab.compose`` (``litlab.cli.api``), imported when first used, so that
    ``import litlab.config...`` stays free of Hydra's runner and torch."""
    if name in ("train", "compose"):
        from litlab.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'litlab' has no attribute {name!r}")
