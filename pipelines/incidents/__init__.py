"""The incident domain: from detectors' scores to incidents, and incidents judged against the truth.

Pure logic, no Spark, Kafka or MLflow: the live job (:mod:`pipelines.detection`), a replay,
training and evaluation (:mod:`models`) and the reports all run these same functions.

* :mod:`~pipelines.incidents.scoring`: detectors' scores per feature row;
* :mod:`~pipelines.incidents.policy`: post-rules' decisions into incidents (open, update, resolve);
* :mod:`~pipelines.incidents.evidence`: what an incident says (evidence, forecast, severity, runbook);
* :mod:`~pipelines.incidents.comparison`: incidents against labelled runs (found, missed, false).
"""
