"""The expert-parallel layout's arithmetic, checked before any collective runs: EP groups tile the
world and hold the experts evenly, and racks of whole EP groups tile it (docs/architecture.md §5).
Torch-free and apart from marin/ep.py (the meshes) so that the exchange (marin/ep_exchange.py), which
ep.py builds on, checks the same rule without importing it back."""

from __future__ import annotations


def check_ep_layout(n_experts: int, ep_size: int, world_size: int) -> None:
    """Raise ValueError (before any collective) unless ep_size divides both world_size and n_experts."""
    if ep_size < 1 or world_size < 1:
        raise ValueError(f"ep_size={ep_size} and world_size={world_size} must be positive")
    if world_size % ep_size != 0:
        raise ValueError(f"EP size ep_size={ep_size} does not divide world_size={world_size}; "
                         f"allowed ep_size: divisors of {world_size}")
    if n_experts % ep_size != 0:
        raise ValueError(f"n_experts={n_experts} is not divisible by EP size ep_size={ep_size}; "
                         f"allowed ep_size: divisors of {n_experts} that divide world_size={world_size}")


def check_replicas(replicas: int, ep_size: int, world_size: int) -> None:
    """Raise ValueError unless `replicas` racks of whole EP groups tile the world."""
    if replicas < 1 or world_size % replicas != 0 or (world_size // replicas) % ep_size != 0:
        raise ValueError(f"TrainConfig.replica_groups={replicas} with world_size={world_size} and EP size "
                         f"{ep_size}: allowed values: divisors r of {world_size} with {world_size}/r a multiple "
                         f"of {ep_size}")
