"""Record real Flink REST answers as test fixtures (run by hand against a lab cluster; not a test).

    .venv/bin/python -m tests.pipelines.collector.record_fixtures NAME [--polls 2] [--every 6] [--cancel]

Polls the lab's cluster like the collector does and writes
``fixtures/NAME.json.gz``: ``{"polls": [{path-and-query: answer, ...}, ...]}``, one mapping per poll.
"""

import argparse
import gzip
import json
import time
import urllib.request
from pathlib import Path

from pipelines.collector import ClusterCollector
from pipelines.config import FlinkClusterEndpoint, load_config

FIXTURES = Path(__file__).parent / "fixtures"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--polls", type=int, default=2)
    parser.add_argument("--every", type=float, default=6.0)
    parser.add_argument("--cancel", action="store_true", help="then cancel the running jobs and poll once more")
    args = parser.parse_args()
    config = load_config()
    settings = config.collector.model_copy(update={"state_dir": None})
    endpoint = FlinkClusterEndpoint(name="lab", rest_url=f"http://127.0.0.1:{config.lab.rest_port}")
    collector = ClusterCollector(endpoint, settings, publish=lambda events: None)
    polls = []
    for poll in range(args.polls):
        if poll:
            time.sleep(args.every)
        collector.rest.recording = {}
        result = collector.poll()
        print(result.line())
        polls.append(collector.rest.recording)
    if args.cancel:
        with urllib.request.urlopen(f"{endpoint.rest_url}/jobs/overview", timeout=10) as answer:
            overview = json.load(answer)
        for job in overview["jobs"]:
            if job["state"] == "RUNNING":
                urllib.request.urlopen(urllib.request.Request(f"{endpoint.rest_url}/jobs/{job['jid']}?mode=cancel",
                                                              method="PATCH"))
        time.sleep(4)
        collector.rest.recording = {}
        print(collector.poll().line())
        polls.append(collector.rest.recording)
    FIXTURES.mkdir(exist_ok=True)
    with gzip.open(FIXTURES / f"{args.name}.json.gz", "wt") as out:
        json.dump({"polls": polls}, out, sort_keys=True)


if __name__ == "__main__":
    main()
