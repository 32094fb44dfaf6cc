"""``python -m pipelines.cli``: the ``sentinel`` command."""

import sys

from pipelines.cli.app import main

sys.exit(main())
