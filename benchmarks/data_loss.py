"""A lock store SIGKILLed and restarted empty under load, with real `dramatiq` worker processes
(issue 20): the longer form of tests/test_data_loss_processes.py.

Two worker processes of four threads run ``until_executed`` payments (200 ms; each event due 3 s
after it is sent, and sent again 1 s and 2 s later) and ``while_executing`` syncs per account
(300 ms), with UniqueJobs on a redis-server of its own without persistence: the lock store, the
only server faulted. Halfway through the load the lock store is SIGKILLed and started again
empty 1.5 s later. Each run is recorded by the workers in the broker's Redis, and every figure
is computed from that record and from what each send returned (tests/data_loss_load.py says how).
The same load without the fault is the control. On RabbitMQ, when one answers at RABBITMQ_URL.

Run: python benchmarks/data_loss.py [seconds of load, 60 by default]
  (the broker and the record on REDIS_URL, else a bundled server; about 5 minutes at 60 s)
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/data_loss_load.py makes the run

from tests.data_loss_load import ERROR, NOT_REBUILT, REBUILT, RESUMED, Figures, run_load  # noqa: E402

try:
    from ._server import describe as describe_server
    from ._server import redis_url
except ImportError:
    from _server import describe as describe_server
    from _server import redis_url

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def rabbitmq_answers() -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except pika.exceptions.AMQPError:
        return False
    return True


def measure(seconds: float) -> list[tuple[str, Figures]]:
    runs = []
    with redis_url() as url:
        print(f"broker's Redis: {describe_server(url)}; {seconds:.0f} s of load per run")
        brokers = [("RedisBroker", "redis", url)]
        if rabbitmq_answers():
            brokers.append(("RabbitMQ", "rabbitmq", RABBITMQ_URL))
        else:
            print(f"RabbitMQ does not answer at {RABBITMQ_URL.split('@')[-1]}: its runs are left out")
        for name, kind, broker_url in brokers:
            for fault in (True, False):
                with tempfile.TemporaryDirectory(prefix="dramatiq-unique-data-loss-") as directory:
                    figures = run_load(
                        broker_kind=kind,
                        broker_url=broker_url,
                        record_url=url,
                        directory=Path(directory),
                        fault=fault,
                        before=seconds / 2,
                        after=seconds / 2,
                    )
                runs.append((f"{name}, {'killed' if fault else 'control'}", figures))
    return runs


def _ms(values: list[int | None]) -> str:
    return ", ".join("-" if value is None else str(value) for value in values) or "-"


def rows(figures: Figures) -> dict[str, str]:
    payments = Counter(send.status for send in figures.sends if send.kind == "payment")
    duplicates = figures.duplicates()
    twice, overlapping = figures.settled_twice()
    copies, refused = figures.refused_after_healing()
    errors = figures.lines(ERROR)
    rebuilt = figures.lines(REBUILT)
    not_rebuilt = figures.lines(NOT_REBUILT)
    outage, healing = figures.refused(), figures.refused("healing")
    fault = figures.fault
    return {
        "payment sends: enqueued / duplicate / refused / healing": (
            f"{payments['enqueued']} / {payments['duplicate']} / {payments['refused']} / {payments['healing']}"
        ),
        "sync sends enqueued": str(sum(s.kind == "sync" and s.status == "enqueued" for s in figures.sends)),
        "locks held before the kill: enqueue + run (keys)": _keys(figures.keys_before),
        "locks held after restart + healing": _keys(figures.keys_after) if fault else "-",
        "sends refused while the store was down": (
            f"{len(outage)} over {outage[-1].at - outage[0].at:.1f} s" if outage else "0"
        ),
        "sends refused while the store healed, ms after restart": (
            f"{len(healing)}: {figures.after_restart(healing[0].at)} to {figures.after_restart(healing[-1].at)}"
            if healing
            else "0"
        ),
        "new locks taken again, ms after restart": _ms([figures.after_restart(at) for at, *_ in figures.lines(RESUMED)])
        if fault
        else "-",
        "duplicate payments enqueued (in the window)": (
            f"{len(duplicates)} ({figures.in_window(duplicates)})" if fault else str(len(duplicates))
        ),
        "events settled twice (overlapping)": f"{twice} ({overlapping})",
        "copies after healing, original pending: refused": f"{refused} of {copies}" if fault else "-",
        "sync pairs that overlapped (sent after detection)": (
            f"{len(figures.sync_overlaps())} ({len(figures.sync_overlaps(sent_after=figures.detected_at))})"
            if fault
            else str(len(figures.sync_overlaps()))
        ),
        "messages lost / enqueued": f"{len(figures.lost)} / {len(figures.enqueued)}",
        "loss ERROR per worker": "/".join(map(str, figures.errors_per_worker.values())) if fault else "-",
        "ERROR, ms after the restart": _ms([figures.after_restart(at) for at, *_ in errors]) if fault else "-",
        "rebuild WARNING (count, ms after restart)": (
            f"{len(rebuilt)}: {_ms([figures.after_restart(at) for at, *_ in rebuilt])}" if fault else "-"
        ),
        "enqueue locks taken again / by a duplicate": _rebuilt(rebuilt) if rebuilt else "-",
        "'not taken again' WARNING (count)": str(len(not_rebuilt)) if fault else "-",
    }


def _keys(counted: Counter) -> str:
    return f"{counted['enqueue']} + {counted['run']} ({counted['keys']})"


def _rebuilt(lines: list) -> str:
    words = lines[0][3].split()
    taken = words[words.index("of") + 1]  # "... the enqueue locks of N messages ..."
    duplicates = lines[0][3].split("keeps. ")[1].split()[0]
    return f"{taken} / {duplicates}"


def table(runs: list[tuple[str, Figures]]) -> list[str]:
    columns = [(name, rows(figures)) for name, figures in runs]
    labels = list(columns[0][1])
    width = max(map(len, labels))
    widths = [max(len(name), *(len(v) for v in values.values())) for name, values in columns]
    lines = [" " * width + " | " + " | ".join(name.ljust(w) for (name, _), w in zip(columns, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for label in labels:
        cells = " | ".join(values[label].ljust(w) for (_, values), w in zip(columns, widths, strict=True))
        lines.append(label.ljust(width) + " | " + cells)
    return lines


def main() -> None:
    logging.basicConfig(level=logging.CRITICAL)  # the sends refused during the outage are expected
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    started = time.monotonic()
    print("\n".join(table(measure(seconds))))
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
