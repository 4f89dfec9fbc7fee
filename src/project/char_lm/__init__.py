"""Character-level language modelling: ``CharLM`` (module.py), a small causal transformer
(nets.py) and text as fixed-length sequences of ASCII characters (data.py: CPython's pydoc topics,
or your own text file)."""
