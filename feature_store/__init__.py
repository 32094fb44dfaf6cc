"""The features, declared once (``definitions``) and computed by one per-job state machine
(``job_features``) for the live stream, replays and the offline store's backfill (``compute``,
``offline_store``), with the labels training reads (``labels``).

Features layer: it may import the foundation (``pipelines.families``, ``pipelines.io``,
``pipelines.datasets``, ...), never the models, the incident domain or the runtimes.
"""
