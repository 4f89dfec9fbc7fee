"""The LightningModule (``module.ClassifierModule``), its networks and learning-rate schedules."""
