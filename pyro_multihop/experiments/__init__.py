"""Experiments on real data and their commands: :mod:`.qa` (facts files, the ``qa`` command)."""
