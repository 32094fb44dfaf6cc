"""The ``sentinel`` command as a spark-submit application: ``spark-submit [options]
infra/spark_submit_main.py run`` runs the detection job on the cluster spark-submit points at.

spark-submit needs a Python file, not a console script; this one has no module beside it that
could shadow a standard one (``pipelines/io`` would shadow ``io`` if ``pipelines/`` were the
script's folder). The project itself must be importable where the driver and the executors run
(installed in their Python, or shipped with ``--archives``; see the README's deployment section).
"""

import sys

from pipelines.cli import main

if __name__ == "__main__":
    sys.exit(main())
