"""Kafka and storage I/O, behind small interfaces: kafka-python clients, the Kafka data source and
stream for Spark, the input topic's publisher, storage locations (a folder or S3) and the HTTP
clients' TLS options. The rest of the code reaches brokers and storage only through here.

Foundation layer: it may import the other foundation modules (``pipelines.config``,
``pipelines.contracts``, ...) and nothing above them (no features, models or runtimes).
"""
