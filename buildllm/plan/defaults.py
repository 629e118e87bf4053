"""Batch size and data-loader workers: what was asked for, or the profile's default for the device
(profiles/*.yaml hold a `cpu` and a `gpu` set each; Device.runtime_defaults says which). The recipe
(optimizer, schedule, learning rates) is decided beside them, in plan/recipe.py."""

from __future__ import annotations

from buildllm.profiles import Profile

# Why CUDA's default is no workers. The host queues a step's kernels far ahead of the GPU (no sync
# between log rows), so building a batch in the training process (slicing one tensor, microseconds)
# costs no step time. Workers would fork a process whose CUDA runtime runs threads (deadlock-prone),
# and a start that does not fork (Device.worker_context) ships the whole token tensor to each worker
# through shared memory, which a container may hold only 64 MiB of.
NO_WORKERS_ON_CUDA = (
    "0: CUDA builds batches in the training process (the host runs ahead of the GPU; workers would "
    "fork a CUDA process or copy the tokens to each); --workers N starts them by a forkserver"
)


def decide_defaults(train, profile: Profile, defaults_for: str, workers_forked_unsafely: bool = False) -> dict:
    """{name: (value, reason)}; workers_forked_unsafely: the device's workers must not be forked from
    the trainer (Device.worker_context), so none are started unless asked for."""
    picked = {}
    for name in ("batch_size", "workers"):
        requested, default = getattr(train, name), getattr(profile.runtime(defaults_for), name)
        picked[name] = (
            (requested, f"requested: {requested}")
            if requested is not None
            else (default, f"{default}: profile {profile.name}'s {defaults_for} default")
        )
    if workers_forked_unsafely and train.workers is None:
        picked["workers"] = (0, NO_WORKERS_ON_CUDA)
    return picked
