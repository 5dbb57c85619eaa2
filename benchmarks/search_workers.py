"""Distributed search benchmark: 1, 2 and 4 worker processes on one PostgreSQL study against one
in-memory worker, on a fixed trial budget, all measured in this run.

A throw-away PostgreSQL server (PostgreSQL's default durable settings, 127.0.0.1) holds one fresh
database per run; its schema is created before the clock starts (a one-time cost per database).
For each run it prints wall seconds, trials per second, the ratio to the in-memory worker and to
one PostgreSQL worker, and the storage overhead per trial: (one PostgreSQL worker's time - the
in-memory time) / trials, with the number of SQL statements per trial counted on the client.
Target: 2 workers on PostgreSQL finish the budget in <= 0.65x the time of 1 worker; the last lines
say what bounds the scaling, from this run's own figures (CPU cores, the server's share).

    PYTHONPATH=. python benchmarks/search_workers.py [--trials 192] [--workers 1 2 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would shadow the
# ``search`` package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import optuna

import autoparallel as ap
from autoparallel.testing.postgres import PostgresServer, unavailable_reason
from cost_model import Training
from search import SearchSettings, find_plan, open_storage
from search._storage import close_storage
from search._workers import run_workers

WORKLOAD = Training(sequence_length_tokens=4096, global_batch_tokens=16 * 2**20)


def _problem(nodes: int):
    return ap.get_model("ref-3t-moe"), ap.get_preset("dgx-h200", num_nodes=nodes)


def _in_memory(*, nodes: int, trials: int, settings: SearchSettings) -> dict:
    model, cluster = _problem(nodes)
    start = time.perf_counter()
    result = find_plan(model, cluster, WORKLOAD, n_trials=trials, settings=settings)
    return {
        "wall_s": time.perf_counter() - start,
        "trials": result.num_trials,
        "step_time_s": result.best.metrics["step_time_s"],
    }


def _statements_per_trial(url: str, *, nodes: int, trials: int, settings: SearchSettings) -> float:
    """SQL statements one worker sends per trial (client-side count, SQLAlchemy events)."""
    import sqlalchemy

    model, cluster = _problem(nodes)
    count = [0]

    def counted(*_: object) -> None:
        count[0] += 1

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", counted)
    try:
        result = find_plan(
            model, cluster, WORKLOAD, n_trials=trials, storage=url, settings=settings
        )
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", counted)
    return count[0] / max(result.num_trials, 1)


def _round_trip_s(url: str, *, repeats: int = 200) -> float:
    """Median seconds of one ``SELECT 1`` through SQLAlchemy on an open connection."""
    import statistics

    import sqlalchemy

    from search import database_url

    engine = sqlalchemy.create_engine(database_url(url), poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                connection.execute(sqlalchemy.text("SELECT 1"))
                times.append(time.perf_counter() - start)
    finally:
        engine.dispose()
    return statistics.median(times)


def _on_postgres(
    server: PostgresServer,
    *,
    name: str,
    workers: int,
    nodes: int,
    trials: int,
    settings: SearchSettings,
) -> dict:
    url = server.create_database(name)
    close_storage(open_storage(url))  # the schema, before the clock
    model, cluster = _problem(nodes)
    cpu_before, own_before = _server_cpu_s(server), _own_cpu_s()
    start = time.perf_counter()
    result = run_workers(
        model, cluster, WORKLOAD, workers=workers, storage=url, n_trials=trials, settings=settings
    )
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "trials": result.num_trials,
        "step_time_s": result.best.metrics["step_time_s"],
        "server_cpu_s": _server_cpu_s(server) - cpu_before,
        "search_cpu_s": _own_cpu_s() - own_before,
    }


def _own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the worker processes)."""
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _server_cpu_s(server: PostgresServer) -> float:
    """CPU seconds used so far by the server: the postmaster, its reaped backends (its children's
    times) and its live backends, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = int((server.folder / "data" / "postmaster.pid").read_text().split()[0])
    total = sum(_cpu_fields(postmaster)[:4])
    for child in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
        total += sum(_cpu_fields(int(child))[:2])
    return total / ticks


def _cpu_fields(pid: int) -> list[int]:
    """utime, stime, cutime, cstime (clock ticks) of ``pid``; zeros if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return [0, 0, 0, 0]
    return [int(v) for v in fields[11:15]]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=192)
    parser.add_argument(
        "--nodes", type=int, default=128, help="dgx-h200 nodes (ref-3t-moe training)"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="server without fsync (shows what durable commits cost)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if (reason := unavailable_reason()) is not None:
        sys.exit(f"cannot run: {reason}")
    settings = SearchSettings(batch_size=args.batch_size, brute_force_layouts=0)
    memory = _in_memory(nodes=args.nodes, trials=args.trials, settings=settings)
    server = PostgresServer.start(durable=not args.no_fsync)
    try:
        runs = {
            n: _on_postgres(
                server,
                name=f"bench{n}",
                workers=n,
                nodes=args.nodes,
                trials=args.trials,
                settings=settings,
            )
            for n in args.workers
        }
        statements = _statements_per_trial(
            server.create_database("count"),
            nodes=args.nodes,
            trials=min(args.trials, 64),
            settings=settings,
        )
        round_trip = _round_trip_s(server.url())
    finally:
        server.stop()
    report = _report(
        memory=memory, runs=runs, statements=statements, round_trip=round_trip, trials=args.trials
    )
    print(report["text"])
    if args.json:
        args.json.write_text(
            json.dumps({k: v for k, v in report.items() if k != "text"}, indent=2) + "\n"
        )


def _report(
    *, memory: dict, runs: dict[int, dict], statements: float, round_trip: float, trials: int
) -> dict:
    one = runs.get(1)
    lines = [
        f"ref-3t-moe training, budget {trials} trials; CPU cores here: {os.cpu_count()}",
        f"{'run':<22}{'wall s':>9}{'trials':>8}{'trials/s':>10}{'vs memory':>11}{'vs 1 pg':>9}{'server cpu s':>14}",
    ]
    lines.append(
        f"{'1 worker, in memory':<22}{memory['wall_s']:>9.2f}{memory['trials']:>8}{memory['trials'] / memory['wall_s']:>10.1f}{1.0:>11.2f}{'':>9}{'':>14}"
    )
    for workers, run in runs.items():
        versus_one = run["wall_s"] / one["wall_s"] if one else float("nan")
        lines.append(
            f"{f'{workers} worker(s), postgres':<22}{run['wall_s']:>9.2f}{run['trials']:>8}{run['trials'] / run['wall_s']:>10.1f}"
            f"{run['wall_s'] / memory['wall_s']:>11.2f}{versus_one:>9.2f}{run['server_cpu_s']:>14.2f}"
        )
    overhead = (one["wall_s"] - memory["wall_s"]) / one["trials"] if one else float("nan")
    lines.append(
        f"storage overhead per trial (1 postgres worker - in memory): {overhead * 1e3:.1f} ms; {statements:.0f} SQL statements "
        f"per trial x {round_trip * 1e3:.2f} ms median round trip (SELECT 1) = {statements * round_trip * 1e3:.1f} ms; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    result = {
        "memory": memory,
        "postgres": runs,
        "overhead_per_trial_s": overhead,
        "statements_per_trial": statements,
        "round_trip_s": round_trip,
        "load_average": os.getloadavg()[0],
    }
    if one and 2 in runs:
        ratio = runs[2]["wall_s"] / one["wall_s"]
        result["two_over_one"] = ratio
        lines.append(
            f"2 workers / 1 worker on postgres: {ratio:.2f}x the time (target <= 0.65x): {'met' if ratio <= 0.65 else 'NOT met'}"
        )
        two = runs[2]
        cores = (two["server_cpu_s"] + two["search_cpu_s"]) / two["wall_s"]
        lines.append(
            f"bound: in the 2-worker run the server used {two['server_cpu_s']:.1f} CPU s and the search processes "
            f"{two['search_cpu_s']:.1f} CPU s in {two['wall_s']:.1f} s: {cores:.2f} of {os.cpu_count()} cores busy on average"
            + (
                " (CPU-bound: more workers cannot go faster here)"
                if cores >= 0.85 * (os.cpu_count() or 1)
                else ""
            )
        )
    result["text"] = "\n".join(lines)
    return result


if __name__ == "__main__":
    main()
