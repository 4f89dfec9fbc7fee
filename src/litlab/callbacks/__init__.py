"""The callbacks every litlab run has, whatever its task: run statistics, the non-finite guard, the
world check, per-step reseeding, the train loader's resume check; and the progress output."""
