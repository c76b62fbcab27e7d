"""Training scripts on real data sets, above :mod:`pyro_multihop.datasets` (which only reads and encodes
files) and :mod:`pyro_multihop.train`: :mod:`pyro_multihop.experiments.babi` (the ``pyro-multihop babi``
command), :mod:`pyro_multihop.experiments.qa` (facts files, the ``qa`` command, bAbI through the facts head),
:mod:`pyro_multihop.experiments.qa_apply` (a trained ``qa`` model applied to new questions)."""
