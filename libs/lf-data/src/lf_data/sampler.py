"""An infinite, sharded, exactly resumable index sampler for data-parallel training."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["ResumableSampler"]


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Endless stream of epochs of dataset indices for one data-parallel rank.

    Epoch ``k`` is a permutation of ``range(num_samples)`` drawn from
    ``numpy.random.default_rng([seed, k])`` (identity when ``shuffle=False``).
    Its first ``world_size * samples_per_epoch`` entries are dealt round-robin:
    rank ``r`` takes ``perm[r::world_size]``, so shards are disjoint and every
    rank yields the same ``samples_per_epoch`` indices, rounded down to a
    multiple of ``batch_size`` (the tail is dropped, so batches never straddle
    epochs).

    Resume: the sampler counts what it has yielded. ``state_dict()`` is
    ``{"epoch", "offset"}`` (offset = indices of this rank already yielded in
    the epoch) plus the settings, which ``load_state_dict`` checks. A sampler
    restored from it yields exactly the indices the uninterrupted one would
    have yielded next. This is exact when the consumer takes what it draws:
    ``DataLoader(num_workers=0)``. With worker processes the DataLoader draws
    ahead of training; then save ``state_for(samples_consumed)`` with the count
    of samples the training loop really used (``steps * batch_size`` since the
    first epoch).

    Iterating again continues from the current position; it does not restart.

    Args:
        num_samples: dataset length. batch_size: per-rank batch size.
        seed: shuffling seed. rank / world_size: this rank and the number of ranks.
        shuffle: permute each epoch (else ascending order).

    Raises:
        ValueError: bad sizes, rank outside ``[0, world_size)``, or fewer than
            ``batch_size`` samples per rank.

    Example:
        >>> s = ResumableSampler(10, batch_size=2, seed=0)
        >>> it = iter(s); first = [next(it) for _ in range(3)]
        >>> s2 = ResumableSampler(10, batch_size=2, seed=0); s2.load_state_dict(s.state_dict())
        >>> next(iter(s2)) == next(it)
        True
    """

    def __init__(self, num_samples: int, *, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        per_rank = (num_samples // world_size) // batch_size * batch_size
        if per_rank == 0:
            raise ValueError(f"num_samples={num_samples} gives fewer than batch_size={batch_size} "
                             f"samples per rank with world_size={world_size}")
        self.num_samples, self.batch_size, self.seed = int(num_samples), int(batch_size), int(seed)
        self.rank, self.world_size, self.shuffle = int(rank), int(world_size), bool(shuffle)
        self.samples_per_epoch = per_rank
        self.epoch, self.offset = 0, 0

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """int64 ``(samples_per_epoch,)``: this rank's indices of ``epoch``, in order."""
        if self.shuffle:
            perm = np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_samples)
        else:
            perm = np.arange(self.num_samples)
        return perm[: self.samples_per_epoch * self.world_size][self.rank :: self.world_size].astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        while True:
            indices = self.epoch_indices(self.epoch)
            while self.offset < len(indices):
                i = int(indices[self.offset])
                self.offset += 1
                yield i
            self.epoch, self.offset = self.epoch + 1, 0

    def _settings(self) -> dict:
        return {"num_samples": self.num_samples, "batch_size": self.batch_size, "seed": self.seed,
                "world_size": self.world_size, "shuffle": self.shuffle}

    def state_dict(self) -> dict:
        """``{"epoch", "offset", ...settings}``: the position after the last yielded index."""
        epoch, offset = divmod(self.offset, self.samples_per_epoch)  # a finished epoch reads as the next
        return {"epoch": self.epoch + epoch, "offset": offset, **self._settings()}

    def state_for(self, samples_consumed: int) -> dict:
        """The state after ``samples_consumed`` indices of this rank since epoch 0, offset 0."""
        if samples_consumed < 0:
            raise ValueError(f"samples_consumed must be >= 0, got {samples_consumed}")
        epoch, offset = divmod(int(samples_consumed), self.samples_per_epoch)
        return {"epoch": epoch, "offset": offset, **self._settings()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; settings stored in it must match this sampler's."""
        for key in ("epoch", "offset"):
            if not isinstance(state.get(key), (int, np.integer)) or state[key] < 0:
                raise ValueError(f"state[{key!r}] must be an int >= 0, "
                                 f"got {state.get(key)!r}")
        for key, value in self._settings().items():
            if key in state and state[key] != value:
                raise ValueError(f"state[{key!r}]={state[key]!r} but this "
                                 f"sampler has {key}={value!r}")
        epoch, offset = divmod(int(state["offset"]), self.samples_per_epoch)
        self.epoch, self.offset = int(state["epoch"]) + epoch, offset
