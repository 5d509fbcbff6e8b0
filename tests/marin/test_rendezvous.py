"""marin_ablate.marin.rendezvous: ranks and the master from SLURM's environment, and a rendezvous that fails
fast with one line instead of hanging (docs/architecture.md, "Multi-node SLURM")."""

import subprocess
import sys
import time

import pytest
from ranks import free_port

from marin_ablate.marin.rendezvous import RendezvousError, first_host, from_env, interface_to, slurm_port


@pytest.mark.parametrize("nodelist,first", [("gpu[003-005,9],cpu1", "gpu003"), ("marin-n1,vm", "marin-n1"),
                                            ("node7", "node7"), ("a[10-11]", "a10")])
def test_first_host_of_a_slurm_hostlist(nodelist, first):
    assert first_host(nodelist) == first


def test_slurm_task_takes_rank_world_and_master_from_slurm_variables():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "46137001",
           "SLURM_JOB_NODELIST": "localhost,other"}
    r = from_env(env)
    assert (r.source, r.rank, r.world_size, r.local_rank) == ("slurm", 3, 4, 1)
    assert r.addr == "127.0.0.1" and r.port == slurm_port("46137001") == 20000 + 46137001 % 20000
    assert from_env({**env, "SLURM_JOB_ID": "46137002"}).port != r.port  # another job, another port
    assert from_env({**env, "SLURM_NTASKS": "1"}).source == "single"
    assert from_env({"RANK": "1", "WORLD_SIZE": "2"}).source == "torchrun"


def test_loopback_master_uses_the_loopback_interface():
    assert interface_to("127.0.0.1") == "lo"


def test_a_rank_that_cannot_reach_the_rendezvous_fails_in_one_line_naming_address_and_port():
    # rank 1 of 2, nobody listens on the port: it must give up at its deadline, not hang
    port = free_port()
    code = ("import sys; from marin_ablate.marin.rendezvous import Rendezvous, init_process_group\n"
            f"init_process_group('gloo', Rendezvous(1, 2, 1, '127.0.0.1', {port}, 'slurm'), timeout_s=1)")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    assert p.returncode != 0 and took < 60, (took, p.stderr[-500:])
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("marin_ablate.marin.rendezvous.RendezvousError: rank 1 of 2 could not meet the others")
    assert f"127.0.0.1:{port}" in last and "within 1s" in last


def test_bad_timeout_is_refused_naming_the_variable(monkeypatch):
    from marin_ablate.marin.rendezvous import rendezvous_timeout_s

    monkeypatch.setenv("MARIN_RENDEZVOUS_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="MARIN_RENDEZVOUS_TIMEOUT_S='soon'; allowed values: seconds > 0"):
        rendezvous_timeout_s()
    with pytest.raises(RendezvousError, match="names no host"):
        first_host("")


def test_gloo_takes_nccl_socket_interfaces_when_they_name_interfaces_exactly():
    from marin_ablate.marin.rendezvous import gloo_interface

    assert gloo_interface("127.0.0.1", {"NCCL_SOCKET_IFNAME": "lo"}) == "lo"
    assert gloo_interface("127.0.0.1", {"NCCL_SOCKET_IFNAME": "=ib0,ib1"}) == "ib0,ib1"  # "=": exact names
    # a prefix ("l" matches lo for NCCL) or an exclusion has no gloo form: the route to the master
    assert gloo_interface("127.0.0.1", {"NCCL_SOCKET_IFNAME": "l"}) == "lo"
    assert gloo_interface("127.0.0.1", {"NCCL_SOCKET_IFNAME": "^docker"}) == "lo"
    assert gloo_interface("127.0.0.1", {}) == "lo"


def test_init_process_group_sets_gloo_interface_for_a_non_gloo_backend_too(monkeypatch):
    """A CUDA run initialises NCCL; its checkpoint writer's gloo group reads GLOO_SOCKET_IFNAME, so it is
    set from NCCL's environment whatever the backend (here the 'fake' backend stands in for NCCL)."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    from marin_ablate.marin.rendezvous import Rendezvous, init_process_group

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=lo")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_process_group("fake", Rendezvous(0, 1, 0, "127.0.0.1", port, "torchrun"), timeout_s=30)
    try:
        import os

        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    finally:
        dist.destroy_process_group()
        monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)


def test_a_704_rank_start_gets_explicit_store_and_collective_timeouts(monkeypatch):
    from marin_ablate.marin.rendezvous import (
        DEFAULT_TIMEOUT_S,
        LARGE_PG_TIMEOUT_S,
        LARGE_STORE_TIMEOUT_S,
        pg_timeout_s,
        rendezvous_timeout_s,
    )

    monkeypatch.delenv("MARIN_RENDEZVOUS_TIMEOUT_S", raising=False)
    monkeypatch.delenv("MARIN_PG_TIMEOUT_S", raising=False)
    assert (rendezvous_timeout_s(704), pg_timeout_s(704)) == (LARGE_STORE_TIMEOUT_S, LARGE_PG_TIMEOUT_S)
    assert (rendezvous_timeout_s(8), pg_timeout_s(8)) == (DEFAULT_TIMEOUT_S, None)  # torch's own watchdog
    assert LARGE_STORE_TIMEOUT_S > DEFAULT_TIMEOUT_S and LARGE_PG_TIMEOUT_S > 600  # above NCCL's 10 min default
    monkeypatch.setenv("MARIN_PG_TIMEOUT_S", "120")
    assert pg_timeout_s(704) == 120.0
    monkeypatch.setenv("MARIN_PG_TIMEOUT_S", "0")
    with pytest.raises(ValueError, match="MARIN_PG_TIMEOUT_S='0'"):
        pg_timeout_s(704)
