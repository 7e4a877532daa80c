"""Replays of recorded steps: what other draft lengths, shapes, stops or devices would have given,
priced under a cost model or profile, noise-free (no models, no clocks).

- ``steplog``: the step log every replay reads, one bench record parsed into ``LoggedStep`` s (and
  the ``tree_log`` observer's ``LoggedTree`` s), once;
- ``recorded``: a recorded bench run with its records parsed (``RecordedRun``) and what a replay
  reads off bench.json's units;
- ``chains``: chain replays of a step log: fixed γ, the oracle, the cost-optimal oracle, a logged
  policy (the bench report's oracle section);
- ``trees``: logged trees replayed at other shapes, node budgets and ``nodes: auto``;
- ``predictions``: a run's speedups predicted under a cost profile;
- ``profiles``: the run's own measured profile, and a profile with another host time;
- ``calibration``: tree calibrations fitted on, or checked against, a run's logged trees;
- ``command``: the ``pacer replay`` command;
- ``stop_rules``: the ``pacer replay-stop`` command, stop rules replayed on held-out simulated steps.
"""
