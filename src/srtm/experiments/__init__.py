"""The paper's experiments, live and simulated, and their reports.

Each family is a subpackage of the same shape (``__init__``: its experiments, by the
``Experiment`` protocol of ``experiment``; ``scenario``, ``sim``, ``live``, ``report``
where it has them): ``scenarios``, ``figures``, ``tenancy``, ``diurnal``, ``utility``.
``registry`` finds an experiment by name."""
