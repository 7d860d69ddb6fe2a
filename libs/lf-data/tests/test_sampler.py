"""ResumableSampler: sharding and exact resume."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lf_data import ResumableSampler


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def test_two_ranks_disjoint_and_cover_the_epoch():
    """Oracle: numpy's permutation for (seed, epoch); shards split its first 2*6 entries."""
    for epoch in range(3):
        perm = np.random.default_rng([5, epoch]).permutation(13)
        r0 = ResumableSampler(13, batch_size=3, seed=5, rank=0, world_size=2).epoch_indices(epoch)
        r1 = ResumableSampler(13, batch_size=3, seed=5, rank=1, world_size=2).epoch_indices(epoch)
        assert len(r0) == len(r1) == 6  # 13 // 2 = 6, a multiple of 3
        assert not set(r0) & set(r1)
        assert sorted([*r0, *r1]) == sorted(perm[:12])
        assert r0.tolist() == perm[0:12:2].tolist()
    s = ResumableSampler(12, batch_size=3, seed=5, rank=1, world_size=2)
    stream = take(s, 18)  # three epochs of 6
    assert stream[:6] == s.epoch_indices(0).tolist() and stream[6:12] == s.epoch_indices(1).tolist()
    assert stream[:6] != stream[6:12]
    assert ResumableSampler(6, batch_size=2, shuffle=False).epoch_indices(3).tolist() == list(range(6))


@pytest.mark.parametrize("drawn", [0, 4, 6, 13, 25])
def test_resume_is_exact_mid_epoch_and_across_epochs(drawn):
    """Oracle: the uninterrupted sampler's next 20 indices."""
    ref = ResumableSampler(11, batch_size=2, seed=3, rank=1, world_size=2)  # 4 per epoch
    it = iter(ref)
    for _ in range(drawn):
        next(it)
    state = ref.state_dict()
    assert (state["epoch"], state["offset"]) == divmod(drawn, 4)
    assert state == ref.state_for(drawn)
    resumed = ResumableSampler(11, batch_size=2, seed=3, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert take(resumed, 20) == [next(it) for _ in range(20)]


def test_resume_through_dataloader():
    """Oracle: an uninterrupted DataLoader(num_workers=0) over the same sampler settings."""
    data = torch.arange(10)
    ref = torch.utils.data.DataLoader(data, batch_size=2, sampler=ResumableSampler(10, batch_size=2, seed=1))
    ref_batches = [b.tolist() for b in itertools.islice(ref, 12)]
    s = ResumableSampler(10, batch_size=2, seed=1)
    first = [b.tolist() for b in itertools.islice(torch.utils.data.DataLoader(data, batch_size=2, sampler=s), 7)]
    s2 = ResumableSampler(10, batch_size=2, seed=1)
    s2.load_state_dict(s.state_dict())
    rest = [b.tolist() for b in itertools.islice(torch.utils.data.DataLoader(data, batch_size=2, sampler=s2), 5)]
    assert first + rest == ref_batches


def test_bad_state_and_settings_raise():
    """Oracle: the documented checks."""
    s = ResumableSampler(10, batch_size=2, seed=1)
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict({**s.state_dict(), "seed": 2})
    with pytest.raises(ValueError, match="offset"):
        s.load_state_dict({"epoch": 0, "offset": -1})
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(10, batch_size=2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableSampler(3, batch_size=2, world_size=2)
