"""Training-free adaptive stop policies read from the draft's own distributions.

``entropy`` (AdaEDL's entropy-based lower bound on acceptance, with an online-calibrated
threshold), ``svip`` (SVIP's fixed entropy threshold: the same bound, not adapted) and
``confidence`` (transformers' ``assistant_confidence_threshold``, with its ROC-based online
threshold). Registered through the ``pacer_sd`` entry point ``pacer_plugins.entropy_stop.plugin``; the decision
rules are pure functions in ``pacer_plugins.entropy_stop.rules``; docs/stop-policies.md states each rule.
"""
