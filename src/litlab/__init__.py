"""litlab: the engine around ``trainer.fit`` -- config checks, run identity, storage and resume,
launchers and sweeps, reports, and the guards -- for any LightningModule and LightningDataModule
that follow its contract (docs/contract.md). Your own code lives in its own package (src/project/)."""
