"""The live detection job on Spark: read the input topic, keep each Flink job's features in
Spark's state, score and decide with :mod:`pipelines.incidents`, publish incidents, dead letters
and the job's own metrics. :func:`pipelines.detection.flink_job.replay` runs the same per-job
steps on a recording without Spark (`sentinel replay`)."""
