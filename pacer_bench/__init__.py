"""The benchmark harness of PACER-SD, beside the engine (pacer_core imports nothing from it).

``config`` the bench/ablation YAML schema and validation; ``labels`` grid points' names;
``answers`` the answer log and the bench folder's files; ``timing`` clocks and the
verification-cost probe; ``units`` what runs per prompt (engine stacks, transformers' baselines);
``run`` the resumable run; ``results`` the report's numbers (results.json); ``report`` report.md
and plots; ``replay`` the replays of recorded steps (the oracle, ``pacer replay``, ``pacer replay-stop``);
``prompts`` the offline prompt sets; ``demo`` the main job; ``commands`` ``pacer demo/bench/report/ablate``.
docs/benchmarks.md documents them.
"""
