"""Your project: LightningModules, networks and LightningDataModules, one folder per task.

It ships with two example tasks that you may edit or delete: ``vision`` (image classification on
the digits that ship inside scikit-learn, synthetic images, or your own image folders) and
``char_lm`` (a small causal transformer that models text character by character). The engine
(``litlab``) knows neither: it reaches your classes through the ``_target_`` of configs/model/ and
configs/data/ (docs/contract.md). ``make rename NAME=...`` renames this package.
"""
