"""Training scripts on real data sets and the commands' work on data files, above :mod:`pyro_multihop.datasets`
(which only reads and encodes files) and :mod:`pyro_multihop.train`: :mod:`pyro_multihop.experiments.chained_babi`
(``pyro-multihop babi --encoding positions``), :mod:`pyro_multihop.experiments.qa` (facts files, the ``qa``
command, bAbI through the facts head), :mod:`pyro_multihop.experiments.qa_apply` (a trained ``qa`` model applied
to new questions), :mod:`pyro_multihop.experiments.train_files` (``pyro-multihop train``),
:mod:`pyro_multihop.experiments.fit_findings` (the starts and diagnostics a command records and prints),
:mod:`pyro_multihop.experiments.apply_checkpoint` (``evaluate``, ``predict``, ``inspect``, ``paths`` on table
data), :mod:`pyro_multihop.experiments.apply_commands` (those four commands: a checkpoint matched with table data
or a facts file) and :mod:`pyro_multihop.experiments.command_defaults` (the defaults the commands' help shows,
without torch)."""
