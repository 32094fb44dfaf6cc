"""The detectors and what is done with them, in two layers:

* scorable models (``detectors``, ``post_rule``, ``registry``, ``baseline``, ``validation``): a
  detector gives a score, a post-rule decides; the MLflow registry, the static alarms and the
  training-set checks. They may import the foundation and ``feature_store``;
* model workflows (``training``, ``evaluation``, ``feedback``): training, calibration and the
  promotion gate, evaluation on labelled runs, on-call's verdicts as labels. They may also import
  the incident domain (``pipelines.incidents``), through which they replay decisions.
"""
