"""Where the ranks of a distributed run meet, from the launcher's environment (torchrun's variables as given,
or SLURM's: docs/architecture.md "Multi-node SLURM" says how rank, world, master address, port and the gloo
interface follow from them), and the process-group init with a deadline (MARIN_RENDEZVOUS_TIMEOUT_S): a rank
that cannot reach it fails with one line naming the address and port instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import socket
import struct
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = PORT_BASE + SLURM_JOB_ID % PORT_SPAN
DEFAULT_TIMEOUT_S = 300.0
#: A large start (LARGE_WORLD ranks or more; the hero: 704 on 176 nodes) gets explicit timeouts (docs/hero.md
#: "Timeouts"): the TCP store waits LARGE_STORE_TIMEOUT_S for every rank (srun starts 176 nodes' tasks over
#: minutes: imports and the venv over a shared filesystem) and the same deadline bounds each sub-group's first
#: NCCL setup, whose unique id goes through the store; LARGE_PG_TIMEOUT_S bounds every collective (NCCL's
#: watchdog): the first step sets up ~10 communicators per rank lazily and a resume reads a 4.3 TB checkpoint
#: between two collectives, yet a rank-divergent collective still fails the job in 30 minutes, not hours.
LARGE_WORLD = 64
LARGE_STORE_TIMEOUT_S = 900.0
LARGE_PG_TIMEOUT_S = 1800.0


class RendezvousError(RuntimeError):
    """A rank could not meet the others (one line: who, where, how long)."""


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world_size: int
    local_rank: int
    addr: str
    port: int
    source: str  # "torchrun", "slurm" or "single"

    def export(self, env: os._Environ | dict | None = None) -> None:
        """Write the env:// variables (what torch.distributed and the trainer read)."""
        e = os.environ if env is None else env
        e.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                 MASTER_ADDR=self.addr, MASTER_PORT=str(self.port))


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist ("gpu[003-005,9],cpu1" -> "gpu003"), as `scontrol show
    hostnames` expands it (the zero padding of the range is kept)."""
    m = re.match(r"\s*([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m or not m.group(1).strip():
        raise RendezvousError(f"SLURM_JOB_NODELIST={nodelist!r} names no host")
    prefix, ranges = m.group(1).strip(), m.group(2)
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def node_address(host: str) -> str:
    """An IPv4 address of SLURM node `host`: its NodeAddr (`scontrol show node`: what slurmctld itself
    uses to reach the node), resolved if it is a name; the resolver alone when scontrol cannot say."""
    addr = host
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(["scontrol", "show", "node", "-o", host], capture_output=True, text=True, timeout=30)
        m = re.search(r"\bNodeAddr=(\S+)", r.stdout) if r.returncode == 0 else None
        if m:
            addr = m.group(1)
    with contextlib.suppress(ValueError):
        return str(ipaddress.IPv4Address(addr))
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise RendezvousError(f"SLURM node {host!r} (NodeAddr {addr!r}) does not resolve to an address: {e}") from None


def slurm_port(job_id: str | int) -> int:
    return PORT_BASE + int(str(job_id).split("_")[0]) % PORT_SPAN


def from_env(env: Mapping[str, str] | None = None) -> Rendezvous:
    """This process's rendezvous, in order: torchrun's variables; a SLURM task of a job with
    SLURM_NTASKS > 1 (addresses from SLURM, see the module docstring); else a single process."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return Rendezvous(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                          env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)), "torchrun")
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist or "SLURM_JOB_ID" not in env:
            raise RendezvousError("a SLURM task of a multi-task job without SLURM_JOB_NODELIST or SLURM_JOB_ID")
        addr = env.get("MASTER_ADDR") or node_address(first_host(nodelist))
        port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else slurm_port(env["SLURM_JOB_ID"])
        return Rendezvous(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                          addr, port, "slurm")
    return Rendezvous(0, 1, 0, "127.0.0.1", 0, "single")


def interface_to(addr: str) -> str | None:
    """The name of this host's interface whose address routes to `addr` (None if none is found)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))  # UDP connect sends nothing: it only picks the route
            local = s.getsockname()[0]
        except OSError:
            return None
        if ipaddress.IPv4Address(local).is_loopback:
            return "lo"
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return None


def gloo_interface(addr: str, env: Mapping[str, str] | None = None) -> str | None:
    """GLOO_SOCKET_IFNAME for this rank: NCCL's interfaces when NCCL_SOCKET_IFNAME names them exactly
    (a list "eth0,eth1", or "=eth0" for an exact match; gloo takes a comma list of names), so NCCL and
    the gloo checkpoint group use one network; else the interface that routes to `addr`. NCCL's prefix
    ("eth": every eth*) and exclusion ("^docker") forms have no gloo equivalent and fall back too."""
    env = os.environ if env is None else env
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if nccl and not nccl.startswith("^"):
        names = [n.strip() for n in nccl.removeprefix("=").split(",") if n.strip()]
        known = {name for _, name in socket.if_nameindex()}
        if names and (nccl.startswith("=") or all(n in known for n in names)):
            return ",".join(names)
    return interface_to(addr)


def _env_seconds(var: str, default: float | None) -> float | None:
    """Seconds from the environment variable `var` (> 0), else `default`; ValueError naming it otherwise."""
    v = os.environ.get(var, "")
    try:
        t = float(v) if v else default
    except ValueError:
        t = -1.0
    if t is not None and not t > 0:
        raise ValueError(f"{var}={v!r}; allowed values: seconds > 0")
    return t


def rendezvous_timeout_s(world: int = 1) -> float:
    """The TCP store's deadline: MARIN_RENDEZVOUS_TIMEOUT_S, else DEFAULT_TIMEOUT_S (LARGE_STORE_TIMEOUT_S
    from LARGE_WORLD ranks on)."""
    default = LARGE_STORE_TIMEOUT_S if world >= LARGE_WORLD else DEFAULT_TIMEOUT_S
    return _env_seconds("MARIN_RENDEZVOUS_TIMEOUT_S", default)


def pg_timeout_s(world: int) -> float | None:
    """Every collective's deadline: MARIN_PG_TIMEOUT_S, else LARGE_PG_TIMEOUT_S from LARGE_WORLD ranks on,
    else None (torch's own: 10 min for NCCL, 30 min for gloo)."""
    return _env_seconds("MARIN_PG_TIMEOUT_S", LARGE_PG_TIMEOUT_S if world >= LARGE_WORLD else None)


def init_process_group(backend: str, rdv: Rendezvous | None = None, timeout_s: float | None = None) -> Rendezvous:
    """torch.distributed.init_process_group at `rdv` (default `from_env()`): every rank meets the
    TCP store of rank 0 within `timeout_s` (default `rendezvous_timeout_s`) or raises
    RendezvousError naming the address and port; every collective's deadline is `pg_timeout_s`."""
    import torch.distributed as dist

    rdv = rdv or from_env()
    t = rendezvous_timeout_s(rdv.world_size) if timeout_s is None else timeout_s
    pg_t = pg_timeout_s(rdv.world_size)
    rdv.export()
    if "GLOO_SOCKET_IFNAME" not in os.environ:  # every backend: a CUDA run's checkpoint group is gloo too
        ifname = gloo_interface(rdv.addr)
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    where = f"{rdv.addr}:{rdv.port}"
    try:
        store = dist.TCPStore(rdv.addr, rdv.port, rdv.world_size, is_master=rdv.rank == 0,
                              timeout=timedelta(seconds=t), wait_for_workers=True)
        # the store's deadline also bounds the process group's own address exchange through it
        dist.init_process_group(backend, store=store, rank=rdv.rank, world_size=rdv.world_size,
                                **({"timeout": timedelta(seconds=pg_t)} if pg_t else {}))
    except (RuntimeError, OSError) as e:  # DistNetworkError/DistStoreError are RuntimeErrors
        msg = " ".join(str(e).split())[:300]
        raise RendezvousError(f"rank {rdv.rank} of {rdv.world_size} could not meet the others at the rendezvous "
                              f"{where} ({rdv.source}) within {t:.0f}s: {msg}") from None
    return rdv
