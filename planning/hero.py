"""How the hero runs on GB200 NVL72 (the "how to run" half of ablations.studies.HeroPlan): its SLURM
resources and sbatch, NCCL over multi-node NVLink, CPU/GPU binding, a pre-flight that every EP group
sits inside one NVLink domain, and the checkpoint arithmetic (bytes, write bandwidth). No torch.

- One SLURM node is one compute tray (4 GPUs, 2 Grace CPUs of 72 cores); one task per GPU, bound to
  36 cores (`--cpu-bind=cores`) and the GPU nearest them (`--gpu-bind=single:1`), ranks laid out in
  node order (`--distribution=block:block`: rank r on node r // 4).
- `--segment=16` asks SLURM's topology/block plugin for blocks of 16 trays inside one NVL72 rack, so
  an EP64 group never straddles racks. The pre-flight checks it anyway before any rank starts: every
  node reports its NVLink fabric (ClusterUUID + CliqueId from `nvidia-smi -q`, the pair NCCL compares
  to decide MNNVL, NVIDIA/nccl issue "Why there are two IDs for MNNVL support?") and its IMEX channel,
  and `check_ep_racks` fails the job naming the EP group that spans two domains.
- NCCL: MNNVL forced on (1; the default 2 falls back to the network when the fabric is not ready),
  cuMem allocations (what MNNVL exports through IMEX), NVLink SHARP (NVLS) for the reductions.
- No path of the planning machine: the job runs `${MARIN_PYTHON:-python}`."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.flops import params_breakdown
from marin_ablate.marin.optimizers import state_bytes_by_role
from marin_ablate.planning.slurm import SlurmOptions, sbatch_params

GiB, GB = 2**30, 1e9

#: Environment of every hero rank (see the module docstring for why each is set).
NCCL_ENV: dict[str, str] = {
    "NCCL_MNNVL_ENABLE": "1",
    "NCCL_CUMEM_ENABLE": "1",
    "NCCL_NVLS_ENABLE": "1",
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # a failed collective tears the job down instead of hanging it
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",  # torchtitan's setting: frees FSDP2 buffers without stream records
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}

#: The job's interpreter: an environment setting on the cluster, else the `python` on the job's PATH.
PYTHON = "${MARIN_PYTHON:-python}"


@dataclass(frozen=True)
class HeroSlurm:
    """SLURM fields of the hero job; `partition`/`account`/`qos` None leave them to the cluster."""

    job_name: str = "hero"
    time_per_job: str | None = None  # HH:MM:SS; None: the plan's HeroPlan.job_time_min (one source)
    preemption_window_s: int = 300  # USR2 this long before the time limit (and what preemption tooling grants)
    cpus_per_node: int = 144
    cpu_bind: str = "cores"
    gpu_bind: str = "single:1"
    python: str = PYTHON
    env: tuple[tuple[str, str], ...] = tuple(sorted(NCCL_ENV.items()))
    network: str | None = None  # e.g. SLURM's switch/nvidia_imex per-job IMEX channel option, where the site has it
    partition: str | None = None
    account: str | None = None

    def time_min(self, plan: Any) -> int:
        """sbatch --time in minutes: `time_per_job` when set, else the plan's job_time_min (what the
        rung's timeout_min and the time model's checkpoint-cadence check read)."""
        if self.time_per_job is None:
            return plan.job_time_min
        parts = [int(x) for x in self.time_per_job.split(":")] if self.time_per_job.count(":") == 2 else []
        if len(parts) != 3:
            raise ValueError(f"HeroSlurm.time_per_job={self.time_per_job!r} must look like HH:MM:SS")
        return parts[0] * 60 + parts[1] + (1 if parts[2] else 0)


def hero_resources(plan: Any, hs: HeroSlurm = HeroSlurm(), folder: str = "$SLURM_SUBMIT_DIR") -> dict:
    """The per-run resources `sweeps.executors.submit` turns into the hero's sbatch (hashable values:
    runs are grouped by them). `folder` is a shared directory for the pre-flight's fabric reports."""
    cpus = hs.cpus_per_node // plan.gpus_per_node  # sweeps.executors exports OMP_NUM_THREADS=cpus
    setup = [f"export {k}={shlex.quote(v)}" for k, v in hs.env]
    setup += preflight_lines(plan.nodes_per_ep_group, f"{folder}/fabric-$SLURM_JOB_ID", hs.python)
    additional: dict[str, Any] = {"segment": plan.nodes_per_ep_group, "mem": "0"}
    if hs.network:
        additional["network"] = hs.network
    return {"gpus": plan.gpus, "gpus_per_node": plan.gpus_per_node, "time_min": hs.time_min(plan),
            "cpus_per_task": cpus, "mem_gb": None, "exclusive": True,
            # the run spans many time-limited jobs: every time-out is a planned requeue
            "max_num_timeout": 100_000, "signal_delay_s": hs.preemption_window_s, "python": hs.python,
            "setup": tuple(setup), "job_name": hs.job_name,
            "srun_args": (f"--cpu-bind={hs.cpu_bind}", f"--gpu-bind={hs.gpu_bind}", "--distribution=block:block"),
            "additional": tuple(sorted(additional.items())),
            **{k: getattr(hs, k) for k in ("partition", "account") if getattr(hs, k)}}


def preflight_lines(nodes_per_ep_group: int, fabric_dir: str, python: str = PYTHON) -> list[str]:
    """Shell lines before the training srun: one task per node writes its fabric report, then
    `check-racks` fails the job (exit 1, before any rank starts) if an EP group straddles domains."""
    report = ('{ ls /dev/nvidia-caps-imex-channels 2>/dev/null | sed "s/^/IMEX_CHANNEL /"; nvidia-smi -q; } '
              '> "$MARIN_FABRIC/$SLURMD_NODENAME.txt"')
    return [
        f'export MARIN_FABRIC="{fabric_dir}"',
        'mkdir -p "$MARIN_FABRIC"',
        'scontrol show hostnames "$SLURM_JOB_NODELIST" > "$MARIN_FABRIC/nodes"',
        f"srun --ntasks-per-node=1 --ntasks=$SLURM_JOB_NUM_NODES --kill-on-bad-exit=1 bash -c {shlex.quote(report)}",
        f'{python} -m marin_ablate.planning.hero check-racks --nodes-per-ep-group {nodes_per_ep_group} '
        '--dir "$MARIN_FABRIC" '
        "|| exit 1",
    ]


def render_sbatch(plan: Any, hs: HeroSlurm = HeroSlurm(), folder: str = "runs/hero/submitit") -> str:
    """The sbatch script `run hero --executor slurm` submits (the same `sbatch_params` path)."""
    from submitit.slurm.slurm import _make_sbatch_string

    res = hero_resources(plan, hs, folder)
    params = sbatch_params(res, SlurmOptions(), 1, hs.job_name)
    params.pop("array_parallelism", None)
    command = f"{res['python']} -u -m submitit.core._submit {shlex.quote(folder)}"
    return _make_sbatch_string(command=command, folder=f"{folder}/%j", **params)


# ---- Rack locality of EP groups ------------------------------------------------------------------


def parse_fabric(text: str) -> dict:
    """{"domain": "ClusterUUID/CliqueId" or None, "imex": bool} from one node's report (IMEX_CHANNEL
    lines, then `nvidia-smi -q`). A GPU whose fabric is not Completed/Success, or an all-zero UUID,
    has no NVLink domain (None)."""
    imex = any(line.startswith("IMEX_CHANNEL ") for line in text.splitlines())
    domains = set()
    for block in re.split(r"\n\s*Fabric\s*\n", text)[1:]:
        f = dict(re.findall(r"^\s*(State|Status|CliqueId|ClusterUUID)\s*:\s*(.*?)\s*$", block[:800], re.M))
        uuid = f.get("ClusterUUID", "")
        ok = (f.get("State") == "Completed" and f.get("Status") == "Success" and uuid
              and set(uuid) - set("0-") and uuid != "N/A")
        domains.add(f"{uuid}/{f.get('CliqueId')}" if ok else None)
    domain = domains.pop() if len(domains) == 1 else None
    return {"domain": domain, "imex": imex}


def check_ep_racks(node_domains: Sequence[tuple[str, str | None]], nodes_per_ep_group: int) -> None:
    """Raise ValueError unless every run of `nodes_per_ep_group` consecutive nodes (in rank order)
    shares one NVLink domain. `node_domains`: (node, domain or None) per node of the job."""
    n = len(node_domains)
    if nodes_per_ep_group < 1 or n % nodes_per_ep_group:
        raise ValueError(f"{n} nodes do not split into EP groups of {nodes_per_ep_group} nodes")
    missing = [h for h, d in node_domains if d is None]
    if missing:
        raise ValueError(f"nodes {missing[:8]}{' ...' if len(missing) > 8 else ''} report no NVLink fabric "
                         "(nvidia-smi -q Fabric: State Completed, Status Success, a ClusterUUID): no MNNVL there")
    bad = []
    for g in range(n // nodes_per_ep_group):
        nodes = node_domains[g * nodes_per_ep_group:(g + 1) * nodes_per_ep_group]
        by_domain: dict[str, list[str]] = {}
        for h, d in nodes:
            by_domain.setdefault(str(d), []).append(h)
        if len(by_domain) > 1:
            bad.append(f"EP group {g} (nodes {g * nodes_per_ep_group}..{(g + 1) * nodes_per_ep_group - 1}) spans "
                       f"{len(by_domain)} NVLink domains: "
                       + "; ".join(f"{d}: {', '.join(hs)}" for d, hs in by_domain.items()))
    if bad:
        raise ValueError("EP groups straddle NVL72 racks (their all-to-all would leave NVLink):\n  " + "\n  ".join(bad))


def fabric_domains(fabric_dir: str | Path) -> list[tuple[str, str | None]]:
    """(node, NVLink domain) of the pre-flight's reports: nodes in job order from `nodes`, each node's report
    `NODE.txt`; every node must have an IMEX channel (CUDA's cross-node memory import fails without one)."""
    d = Path(fabric_dir)
    nodes = [h for h in (d / "nodes").read_text().split() if h]
    reports = {}
    for h in nodes:
        p = d / f"{h}.txt"
        if not p.is_file():
            raise ValueError(f"node {h} wrote no fabric report ({p})")
        reports[h] = parse_fabric(p.read_text())
    no_imex = [h for h in nodes if not reports[h]["imex"]]
    if no_imex:
        raise ValueError(f"nodes {no_imex[:8]} have no IMEX channel (/dev/nvidia-caps-imex-channels/channelN): "
                         "ask the site for one per job (SLURM switch/nvidia_imex) or set HeroSlurm.network")
    return [(h, reports[h]["domain"]) for h in nodes]


def _hostnames(hostlist: str) -> list[str]:
    r = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ValueError(f"scontrol show hostnames {hostlist!r} failed: {r.stderr.strip()}")
    return r.stdout.split()


def topology_domains(nodes: Sequence[str], topology: str | None = None) -> list[tuple[str, str | None]]:
    """(node, leaf switch) per node from SLURM's topology (`scontrol show topology`, topology/tree:
    the Level=0 switches are the racks); a node under no leaf switch has no domain (None). The CPU
    cluster of tests/integration/test_slurm_nodes.py groups its nodes into racks this way."""
    if topology is None:
        r = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ValueError(f"scontrol show topology failed: {r.stderr.strip() or r.returncode}")
        topology = r.stdout
    leaf: dict[str, str] = {}
    for line in topology.splitlines():
        f = dict(re.findall(r"(\w+)=(\S+)", line))
        if f.get("Level") == "0" and f.get("SwitchName") and f.get("Nodes") not in (None, "(null)"):
            for h in _hostnames(f["Nodes"]):
                leaf[h] = f["SwitchName"]
    return [(h, leaf.get(h)) for h in nodes]


# ---- Checkpoint bytes and bandwidth --------------------------------------------------------------

#: marin.flops.params_breakdown component -> optimizer role (marin.model `_role`)
_ROLE_OF = {"embed": "embed", "lm_head": "lm_head", "final_norm": "norm", "embed_norm": "norm", "norms": "norm",
            "stem_gated_norms": "matrix", "gated_norm": "matrix", "attention": "matrix", "latent": "matrix",
            "shared": "matrix", "attn_gate": "gate", "sconv": "sconv", "router": "router", "routed": "expert"}


def params_by_role(spec: RunSpec) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in params_breakdown(spec.model, spec.recipe).items():
        out[_ROLE_OF[k]] = out.get(_ROLE_OF[k], 0) + v
    return out


def checkpoint_plan(spec: RunSpec, gpus: int, window_s: float, levels: Sequence[str] = ("hyperball", "adamw")) -> dict:
    """Bytes of one checkpoint (fp32 parameters + fp32 optimizer state, every parameter once: the
    distributed checkpoint writes each shard once, whatever the replication) in total and per rank
    (evenly sharded), and the aggregate write bandwidth that saves it inside `window_s`."""
    by_role = params_by_role(spec)
    n = sum(by_role.values())
    out = {}
    for level in levels:
        state_bytes = state_bytes_by_role(level)
        state = sum(state_bytes[r] * k for r, k in by_role.items())
        total = 4 * n + state
        out[level] = {"params_bytes": 4 * n, "optimizer_bytes": state, "total_bytes": total,
                      "per_rank_bytes": total / gpus, "write_gb_per_s": total / GB / window_s,
                      "write_gb_per_s_per_rank": total / GB / window_s / gpus}
    return {"window_s": window_s, "gpus": gpus, "async_save": True, "levels": out}


def format_checkpoint(cp: dict) -> str:
    lines = [f"checkpoint (fp32 parameters + optimizer state; torch.distributed.checkpoint async save: the step "
             f"loop resumes once the shards are staged in host memory, the write must finish inside the "
             f"{cp['window_s']:.0f} s preemption window):"]
    for level, c in cp["levels"].items():
        lines.append(f"  {level}: {c['total_bytes'] / 1e12:.2f} TB ({c['params_bytes'] / 1e12:.2f} params + "
                     f"{c['optimizer_bytes'] / 1e12:.2f} optimizer), {c['per_rank_bytes'] / GB:.2f} GB per rank over "
                     f"{cp['gpus']} ranks; needs >= {c['write_gb_per_s']:.1f} GB/s aggregate "
                     f"({c['write_gb_per_s_per_rank'] * 1000:.0f} MB/s per rank)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marin_ablate.planning.hero")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-racks", help="fail unless every EP group's nodes share one NVLink domain")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--dir", help="the pre-flight's folder: `nodes` and NODE.txt reports")
    src.add_argument("--topology", metavar="NODELIST", help="racks from SLURM's topology (scontrol show "
                     "topology) for these nodes, e.g. \"$SLURM_JOB_NODELIST\"")
    c.add_argument("--nodes-per-ep-group", type=int, required=True)
    args = p.parse_args(argv)
    try:
        # on a cluster described by a SLURM topology file, the job's nodes in rank order (`scontrol show hostnames`)
        pairs = topology_domains(_hostnames(args.topology)) if args.topology is not None else fabric_domains(args.dir)
        check_ep_racks(pairs, args.nodes_per_ep_group)
    except (ValueError, OSError) as e:
        print(f"hero pre-flight FAILED: {e}", file=sys.stderr)
        return 1
    groups = len(pairs) // args.nodes_per_ep_group
    print(f"hero pre-flight: {len(pairs)} nodes, {groups} EP groups, each inside one NVLink domain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
