"""Where the enumerated Pyro loss spends the time the fused loss does not, at small contexts.

Two measurements behind docs/exactness.md's account of the chained-loss benchmark (L = 1, N = 10):

1. **Fixed cost per call** at ``n = 1``: the library's enumerated model, a minimal two-site enumerated
   model written here with plain tensors (no ``PyroModule``, no validation of observations, the same
   gate and emission), and the fused loss. If the minimal model costs about as much as the library's,
   the fixed cost is ``TraceEnum_ELBO``'s, not the model's.
2. **Share of batched matrix products** in the Pyro loss at ``n = 20000`` (torch profiler, self CPU
   time): Pyro contracts each enumerated factor with ``torch.einsum``, which becomes ``bmm`` with batch
   ``n`` and ``N``-wide matrices.

Usage::

    python benchmarks/pyro_overhead.py --out benchmarks/results
    python benchmarks/pyro_overhead.py --out /tmp/bench --smoke
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import TraceEnum_ELBO, config_enumerate
from pyro.ops.indexing import Vindex

from chained_loss import check_agreement, random_emission, random_observations, time_side_by_side  # benchmarks/, beside this file
from pyro_multihop import ChainedAttention
from pyro_multihop.distributions import TableCategorical

SYMBOLS, CONTEXT = 30, 10


def _losses(n: int) -> dict:
    """``name -> callable`` computing loss + gradient for one hop at context length 10."""
    obs = random_observations(n, CONTEXT, SYMBOLS)
    head = ChainedAttention(1, SYMBOLS, SYMBOLS, sigma2=0.1, init="identity", seed=0,
                            emission=random_emission(SYMBOLS, SYMBOLS))
    key_table = head.key_tables.detach()[0].clone().requires_grad_(True)
    emission_logits = head.emission_logits.detach().clone().requires_grad_(True)
    elbo = TraceEnum_ELBO(max_plate_nesting=1)

    @config_enumerate
    def minimal_model():
        scores = (2 * key_table - key_table.pow(2).sum(-1, keepdim=True)) / 0.2
        with pyro.plate("observations", n, dim=-1):
            position = pyro.sample("z_1", dist.Categorical(logits=scores[obs.keys, obs.query.unsqueeze(-1)]))
            value = Vindex(obs.values)[..., position]
            pyro.sample("target", TableCategorical(emission_logits.log_softmax(-1), value), obs=obs.target)

    def minimal_guide():
        pass

    def library():
        head.zero_grad(set_to_none=True)
        loss = elbo.differentiable_loss(head.model, head.guide, obs)
        loss.backward()
        return float(loss.detach())

    def minimal():
        key_table.grad = emission_logits.grad = None
        loss = elbo.differentiable_loss(minimal_model, minimal_guide)
        loss.backward()
        return float(loss.detach())

    def fused():
        head.zero_grad(set_to_none=True)
        loss = -head.log_likelihood(obs).sum()
        loss.backward()
        return float(loss.detach())

    return {"Pyro, library model": library, "Pyro, minimal model": minimal, "fused": fused}


def fixed_costs(repeats: int) -> dict:
    functions = _losses(1)
    check_agreement({name: function() for name, function in functions.items()}, f"L=1 N={CONTEXT} n=1")
    return time_side_by_side(functions, repeats, warmup_rounds=5)


def bmm_share(n: int, repeats: int) -> float:
    from torch.profiler import ProfilerActivity, profile

    library = _losses(n)["Pyro, library model"]
    for _ in range(3):
        library()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(repeats):
            library()
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    return sum(event.self_cpu_time_total for event in events if event.key == "aten::bmm") / total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--smoke", action="store_true", help="few repeats, small n")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with pyro.get_param_store().scope():
        costs = fixed_costs(5 if args.smoke else 200)
        share = bmm_share(200 if args.smoke else 20000, 2 if args.smoke else 10)
    lines = ["| L = 1, N = 10, n = 1 | ms per loss + gradient (median) |", "|---|---|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in costs.items()]
    lines.append("")
    lines.append(f"Share of `aten::bmm` in the self CPU time of the Pyro loss at L = 1, N = 10, "
                 f"n = {200 if args.smoke else 20000}: {share:.0%}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "pyro_overhead.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
