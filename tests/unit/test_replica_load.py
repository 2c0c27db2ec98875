"""A replica's load between two reports: the last report moved by this gateway's own calls since."""

import asyncio

from common.gen import worker_pb2
from gateway.routing.replica import WorkerReplica


def test_calls_ended_since_the_last_report_no_longer_count_and_new_ones_do() -> None:
    async def check() -> None:
        replica = WorkerReplica("127.0.0.1:1", None)
        try:
            assert replica.load == 0
            replica.in_flight = 2  # no report yet: this gateway's calls
            assert replica.load == 2
            # A report: 5 running or waiting there (3 of them this gateway's), as the watcher takes it.
            replica.in_flight = 3
            replica.report = worker_pb2.LoadReport(num_running=4, num_waiting=1)
            replica.in_flight_at_report = replica.in_flight
            assert replica.load == 5
            replica.in_flight -= 2  # two of ours ended; the worker has not reported it yet
            assert replica.load == 3
            replica.in_flight += 1  # one more started
            assert replica.load == 4
            # A report that already counted an end before this gateway saw it: never below our own calls.
            replica.report = worker_pb2.LoadReport(num_running=0)
            replica.in_flight_at_report = 3
            assert replica.load == 2
        finally:
            await replica.close()

    asyncio.run(check())
