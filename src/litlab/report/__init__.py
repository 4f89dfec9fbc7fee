"""Sweep reports: collect runs (``collect``), compare them (``compare``), write them (``render``),
and the Hydra callback that does all three when a multirun ends (``callback``)."""
