"""litlab."""
