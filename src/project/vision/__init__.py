"""Image classification: ``ImageClassifier`` (module.py), its networks (nets.py) and datamodules
(data.py: digits and synthetic images in memory; image_folder.py: your own images on disk)."""
