"""Your project: LightningModules, networks and LightningDataModules, one folder per task.

Two example tasks to edit or delete: ``vision`` (image classification) and ``char_lm`` (a character
language model). The engine knows neither: it reaches your classes through the ``_target_`` of
configs/model/ and configs/data/ (docs/contract.md). ``make rename NAME=...`` renames this package.
"""
