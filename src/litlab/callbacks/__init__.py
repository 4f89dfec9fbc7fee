"""Callbacks litlab adds to Lightning's: run statistics, progress output."""
