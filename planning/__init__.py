"""Planning a GPU study before it runs: the dry run (`dryrun`: memory on fake devices, `rehearsal`: one step on a
host/accelerator split with an NCCL-like group), the memory (`memory`), time (`timemodel`) and host cost
(`costmodel`) models, and the hero's SLURM layout (`hero`). docs/hero.md."""
