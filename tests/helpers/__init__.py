"""What several test files share: the `sentinel` command, /metrics, topics filled as the job and
the collector fill them, hand-made incidents, pages as a browser reads them, a real Alertmanager,
the detection job's end-to-end steps, waiting. No tests live here: test modules import from this
package (or take fixtures from a conftest.py), never from each other (tests/test_layout.py).
"""
