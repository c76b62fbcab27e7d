"""What the tests of tests/train/ share: a small chained head, its exact loss, and a toy head on a data type
that is not Observations (``import svi_test_heads``)."""

import math

import pyro
import torch

from pyro_multihop import ChainedAttention


def small_head(seed=0, **kwargs):
    return ChainedAttention(2, 30, 30, sigma2=0.1, seed=seed, **kwargs)


def exact_loss(head, obs) -> float:
    with torch.no_grad():
        return float(-head.log_likelihood(obs).mean())


class Points:
    """A data type that is not Observations: scalar points, built from its one tensor attribute."""

    def __init__(self, x):
        self.x = torch.as_tensor(x)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return Points(self.x[index])

    def to(self, device):
        return Points(self.x.to(device))


class GaussianMean(pyro.nn.PyroModule):
    """A toy head on Points: x ~ Normal(mu, 1), mu a parameter; the head API fit_svi relies on."""

    def __init__(self):
        super().__init__()
        self.mu = torch.nn.Parameter(torch.zeros(()))

    def check_observations(self, obs, name="obs"):
        if not isinstance(obs, Points):
            raise TypeError(f"{name} must be Points, got {type(obs).__name__}")
        return obs

    @pyro.nn.pyro_method
    def model(self, obs, subsample_size=None):
        with pyro.plate("obs", len(obs), subsample_size=subsample_size, dim=-1) as rows:
            pyro.sample("x", pyro.distributions.Normal(self.mu, 1.0), obs=obs.x[rows])

    @pyro.nn.pyro_method
    def guide(self, obs, subsample_size=None):
        pass

    collapsed_model = model  # nothing to enumerate: the plain Trace_ELBO route

    def svi_kwargs(self, step):
        return {}

    def evaluate(self, obs):
        with torch.no_grad():
            log_likelihood = pyro.distributions.Normal(self.mu, 1.0).log_prob(obs.x).mean()
        return {"log_likelihood": float(log_likelihood), "accuracy": math.nan, "n": len(obs)}
