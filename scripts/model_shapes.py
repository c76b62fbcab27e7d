"""Print ``Trace.format_shapes()`` of the enumerated chained model (the table in its docstring)."""

import argparse

from pyro import poutine

from pyro_multihop import ChainedAttention, transitive_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hops", type=int, default=2)
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    head = ChainedAttention(args.hops, 30, 30)
    obs = transitive_task(args.n, pairs=args.pairs, seed=0)
    trace = poutine.trace(poutine.enum(head.model, first_available_dim=-2)).get_trace(obs)
    trace.compute_log_prob()
    print(trace.format_shapes())


if __name__ == "__main__":
    main()
