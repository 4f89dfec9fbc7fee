"""LightningDataModules. In-memory image datasets share ``memory.InMemoryImageDataModule``."""
