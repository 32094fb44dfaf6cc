"""checkpoint-sentinel's streaming job and everything around it, in layers (docs/DEVELOPING.md,
"The layer map"; ``tests/test_import_layers.py`` holds them). A module imports its own layer and
those below, never one above:

1. foundation, importing nothing above it: ``families``, ``config``, ``contracts``, ``io``,
   ``datasets``, ``telemetry``, ``display``, ``spark_session`` (and this package itself);
2. the features, ``feature_store`` (a package beside this one);
3. the scorable models, ``models``' detectors, post-rules, registry and static alarms;
4. the incident domain, ``incidents``: pure, no Spark, Kafka or MLflow;
5. ``models``' workflows (training, evaluation, feedback);
6. the runtimes and reports: ``detection``, ``collector``, ``simulator``, ``lab``, ``alerting``,
   ``reports``, ``feedback``, ``selfcheck``;
7. the command line, ``cli``, which may import all of them.
"""
