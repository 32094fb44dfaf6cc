"""What several test files share: running the `sentinel` command, reading /metrics, filling topics,
hand-made incidents, reading pages, a real Alertmanager. No tests live here: test modules import
from this package (or take fixtures from a conftest.py), never from each other (tests/test_layout.py).
"""
