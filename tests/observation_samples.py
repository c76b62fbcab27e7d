"""Small observations shared by the tests of tests/data/ (importable as ``observation_samples``)."""

import torch

from pyro_multihop import Observations, transitive_task


def small_obs(masked=False):
    mask = torch.tensor([[True, True, False], [True, False, True]]) if masked else None
    return Observations(
        keys=torch.tensor([[0, 1, 2], [3, 4, 5]]),
        values=torch.tensor([[6, 7, 8], [9, 10, 11]]),
        query=torch.tensor([1, 3]),
        target=torch.tensor([2, 0]),
        mask=mask,
    )


def task_with_padding(masked: bool) -> Observations:
    """50 rows of the transitive task, with about 30% of the positions padding if ``masked``."""
    obs = transitive_task(50, seed=3)
    if not masked:
        return obs
    mask = torch.rand(50, obs.context_len, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    return Observations(obs.keys, obs.values, obs.query, obs.target, mask)
