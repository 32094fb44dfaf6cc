"""The three topic contracts (``docs/CONTRACTS.md``), and the feedback topic's, owned here and nowhere else.

Foundation layer: it imports nothing of the product but the family registry. The JSON Schema
files in ``schemas/`` are the single source; :mod:`pipelines.contracts.contract` loads them. The
Spark schemas the job parses with are generated from them by :meth:`Contract.spark_schema`, so a
field added to a contract reaches the parser without a second edit (``tests/pipelines/test_contracts.py``
proves the two agree); ``examples`` holds small valid input events for self-checks and tests.

>>> INPUT.spark_schema()["ts"].dataType.simpleString()
'bigint'
>>> INPUT.errors({"schema_version": 1, "kind": "job_status"})[0]
"'cluster' is a required property"
>>> INPUT.accepts({"schema_version": 1, "kind": "job_status"})
False
"""

from pipelines.contracts.contract import (DEAD_LETTER, EVENT_KINDS, FEEDBACK, INCIDENT, INCIDENT_EVENTS,
                                          INCIDENT_FAMILIES, INPUT, SCHEMA_VERSION, SEVERITIES, TERMINAL_JOB_STATES,
                                          Contract, ContractError, input_event_key)

__all__ = ["DEAD_LETTER", "EVENT_KINDS", "FEEDBACK", "INCIDENT", "INCIDENT_EVENTS", "INCIDENT_FAMILIES", "INPUT",
           "SCHEMA_VERSION", "SEVERITIES", "TERMINAL_JOB_STATES", "Contract", "ContractError", "input_event_key"]
