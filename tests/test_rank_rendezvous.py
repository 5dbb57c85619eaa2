"""The forked ranks' rendezvous binds its port when it serves it: no port is chosen beforehand
and released, so a port another process takes in between cannot fail the group (EADDRINUSE on
rank 0, the other ranks waiting out their connect timeout)."""

from __future__ import annotations

import socket

import pytest

from autoparallel.runtime import _ranks
from autoparallel.testing import run_ranks


def _rank_and_port(rank: int, world_size: int) -> tuple[int, int, str]:
    import os

    import torch.distributed as dist

    return rank, dist.get_world_size(), os.environ["MASTER_PORT"]


@pytest.mark.distributed
def test_ranks_form_a_group_while_the_preselected_port_is_taken(monkeypatch):
    """``free_port`` is made to return a port a listening socket holds (what another test's
    server can do between the choice and the bind): the ranks still form their group, on the
    port rank 0's store was given."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(_ranks, "free_port", lambda: taken)
        results = run_ranks(_rank_and_port, 3, timeout_s=60.0, collective_timeout_s=30.0)
    assert [(rank, size) for rank, size, _ in results] == [(0, 3), (1, 3), (2, 3)]
    ports = {port for _, _, port in results}
    assert len(ports) == 1 and str(taken) not in ports


def test_a_rank_without_a_published_port_times_out_naming_itself():
    with pytest.raises(TimeoutError, match=r"rank 2: rank 0 published no rendezvous port"):
        _ranks.rendezvous_store(
            2, 3, timeout_s=0.05, publish=lambda port: None, lookup=lambda: None
        )


def test_rank_zero_publishes_the_port_its_store_listens_on():
    import datetime

    import torch.distributed as dist

    published: list[int] = []
    server = _ranks.rendezvous_store(
        0, 2, timeout_s=5.0, publish=published.append, lookup=lambda: None
    )
    assert published == [server.port] and server.port > 0
    client = dist.TCPStore(
        "127.0.0.1", published[0], 2, False, timeout=datetime.timedelta(seconds=5)
    )
    client.set("key", "value")
    assert server.get("key") == b"value"
