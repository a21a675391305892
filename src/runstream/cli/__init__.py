"""The ``runstream`` command (click). It may import anything in the package; nothing
imports it but the console script and ``python -m runstream``."""
