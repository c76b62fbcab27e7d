"""The tests' random inputs, seeded, with their sizes: observations, and a head of each kind (chained,
position-gate, tied, either of the two for the engine's tests, structured facts); and the markers that run a test
over the settings these take. Their brute-force references are tests/oracle.py and tests/facts_oracle.py.

Importable as ``factories`` (tests/ is on sys.path). Each factory's defaults are the values its tests were
written with: a test that needs other sizes, seeds or ``sigma2`` passes them.
"""

import math

import pytest
import torch

#: The small sizes most tests run at: ``S`` symbols, ``T`` targets, ``N`` positions; ``D`` the tied head's
#: embedding dimension.
S, T, N, D = 5, 4, 4, 3
#: The position-gate head's positions and ``max_distance``: ``POSITION_GATE_N - 1 = 4 > MAX_DISTANCE``, so ages
#: and offsets are clipped in its tests.
POSITION_GATE_N, MAX_DISTANCE = 5, 2

HOPS = pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
MASKED = pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])
#: The two heads of :func:`random_head`.
HEADS = pytest.mark.parametrize("kind", ["chained", "tied"])
#: The engine's two routes: ``math.inf`` forces the symbol route at every size, 0 the dense positions route
#: (the value of ``engine.routes.SYMBOL_ROUTE_RATIO``).
ROUTES = pytest.mark.parametrize("ratio", [math.inf, 0.0], ids=["symbols", "positions"])
#: Emissions for the underflowing rows: random (they are retried on their dense factors), or with target
#: probabilities e^700 apart (some underflow there too, and are recomputed in log space).
EMISSION_GAPS = pytest.mark.parametrize("emission_gap", [None, 700.0], ids=["random emission", "emission e^700 apart"])


# -- observations ---------------------------------------------------------------------------------------------
def random_observations(n, num_symbols, num_targets, context, seed=1, masked=False):
    """Uniformly random observations (seeded); with ``masked``, about 30% padding, position 0 always real."""
    from pyro_multihop import Observations

    generator = torch.Generator().manual_seed(seed)
    mask = None
    if masked:
        mask = torch.rand(n, context, generator=generator) > 0.3
        mask[:, 0] = True
    return Observations(
        torch.randint(num_symbols, (n, context), generator=generator),
        torch.randint(num_symbols, (n, context), generator=generator),
        torch.randint(num_symbols, (n,), generator=generator),
        torch.randint(num_targets, (n,), generator=generator),
        mask,
    )


def random_obs(n=6, seed=1, masked=False, context=N):
    """:func:`random_observations` at the small sizes ``S`` and ``T``."""
    return random_observations(n, S, T, context, seed, masked)


def random_position_gate_obs(n=5, seed=1, masked=False):
    """:func:`random_obs` of the position-gate tests' ``POSITION_GATE_N`` positions."""
    return random_obs(n, seed, masked, context=POSITION_GATE_N)


# -- heads ----------------------------------------------------------------------------------------------------
def random_chained_head(n_hops, num_symbols=S, num_targets=T, seed=0, sigma2=0.6, dtype=torch.float64, scale=1.0,
                        **options):
    """A ``ChainedAttention`` with seeded random key tables (``scale`` times standard normal) and emission."""
    from pyro_multihop import ChainedAttention

    generator = torch.Generator().manual_seed(seed)
    return ChainedAttention(
        n_hops,
        num_symbols,
        num_targets,
        sigma2=sigma2,
        key_tables=scale * torch.randn(n_hops, num_symbols, num_symbols, generator=generator, dtype=dtype),
        emission=torch.rand(num_symbols, num_targets, generator=generator, dtype=dtype).softmax(-1),
        **options,
    )


def random_position_gate_head(n_hops, seed=0, sigma2=0.6):
    """A float64 ``ChainedAttention(max_distance=MAX_DISTANCE)`` at sizes ``S``, ``T``: seeded random key tables
    and emission, and age, offset and direction terms twice standard normal."""
    from pyro_multihop import ChainedAttention

    generator = torch.Generator().manual_seed(seed)
    head = ChainedAttention(
        n_hops,
        S,
        T,
        sigma2=sigma2,
        key_tables=torch.randn(n_hops, S, S, generator=generator, dtype=torch.float64),
        emission=torch.rand(S, T, generator=generator, dtype=torch.float64).softmax(-1),
        max_distance=MAX_DISTANCE,
    )
    with torch.no_grad():
        head.age_slopes.copy_(2 * torch.randn(head.age_slopes.shape, generator=generator, dtype=torch.float64))
        head.offset_slopes.copy_(2 * torch.randn(head.offset_slopes.shape, generator=generator, dtype=torch.float64))
        head.direction_logits.copy_(2 * torch.randn(head.direction_logits.shape, generator=generator, dtype=torch.float64))
    return head


def random_tied_head(n_hops=2, seed=0, sigma2=0.6, dtype=torch.float64, **options):
    """A ``TiedEmbeddingAttention`` at sizes ``S``, ``D``, ``T`` with a seeded random guide (means standard
    normal, scales in [0.2, 1.2)) and emission; ``options`` go to the constructor."""
    from pyro_multihop.models.tied import TiedEmbeddingAttention

    generator = torch.Generator().manual_seed(seed)
    return TiedEmbeddingAttention(
        S,
        D,
        T,
        n_hops,
        sigma2,
        loc=torch.randn(S, D, generator=generator, dtype=dtype),
        scale=0.2 + torch.rand(S, D, generator=generator, dtype=dtype),
        emission=torch.rand(S, T, generator=generator, dtype=dtype).softmax(-1),
        **options,
    )


def random_head(kind, n_hops, seed=0, sigma2=0.6, scale=1.0, dtype=torch.float64, emission_gap=None):
    """A random head of either kind of :data:`HEADS` at sizes ``S``, ``T`` (the engine's tests run on both): the
    emission drawn first, then ``scale`` times standard normal key tables (``"chained"``) or embedding means in 3
    dimensions (``"tied"``, its gate read at the means: ``plug_in="mean"``). With ``emission_gap``, an emission
    whose target log-probabilities are 0 or ``-emission_gap`` (700: beyond float64's range of sums, so that a
    sharp last hop attending a value of the wrong kind leaves the likelihood below the underflow floor even on the
    dense factors)."""
    from pyro_multihop import ChainedAttention, TiedEmbeddingAttention

    generator = torch.Generator().manual_seed(seed)
    emission = torch.rand(S, T, generator=generator, dtype=dtype).softmax(-1)
    if emission_gap is not None:
        matches = torch.arange(S).unsqueeze(-1) % T == torch.arange(T)
        emission = torch.where(matches, 0.0, -emission_gap).to(dtype).softmax(-1)
    if kind == "chained":
        tables = scale * torch.randn(n_hops, S, S, generator=generator, dtype=dtype)
        return ChainedAttention(n_hops, S, T, sigma2=sigma2, key_tables=tables, emission=emission)
    loc = scale * torch.randn(S, 3, generator=generator, dtype=dtype)
    # The engine's checks read the gate at the means (plug_in="mean"); tests/models/test_tied.py checks the
    # default expected-distance table against brute force.
    return TiedEmbeddingAttention(S, 3, T, n_hops=n_hops, sigma2=sigma2, loc=loc, emission=emission, plug_in="mean")


# -- structured facts -----------------------------------------------------------------------------------------
def random_fact_observations(n, N, F, M, S, seed=0, padded=True):
    """Seeded random rows; with ``padded``, padded facts anywhere (fact 0 or another real), padded fields of real
    facts (one field always real), padded question tokens, -1 at every padding, and half the targets copied
    from a real field (so copy and table both matter)."""
    from pyro_multihop import FactObservations

    g = torch.Generator().manual_seed(seed)
    facts = torch.randint(S, (n, N, F), generator=g)
    question = torch.randint(S, (n, M), generator=g)
    target = torch.randint(S, (n,), generator=g)
    fact_mask = field_mask = question_mask = None
    if padded:
        fact_mask = torch.rand(n, N, generator=g) > 0.3
        fact_mask[torch.arange(n), torch.randint(N, (n,), generator=g)] = True
        field_mask = (torch.rand(n, N, F, generator=g) > 0.3) & fact_mask.unsqueeze(-1)
        field_mask[torch.arange(n), :, torch.randint(F, (n,), generator=g)] |= fact_mask
        question_mask = torch.rand(n, M, generator=g) > 0.3
        question_mask[torch.arange(n), torch.randint(M, (n,), generator=g)] = True
        facts = facts.masked_fill(~field_mask, -1)
        question = question.masked_fill(~question_mask, -1)
    obs = FactObservations(facts, question, target, fact_mask, field_mask, question_mask)
    copy = torch.rand(n, generator=g) < 0.5
    real = obs.real_fields().flatten(1)
    pick = torch.multinomial(real.double(), 1, generator=g).squeeze(1)
    target = torch.where(copy, obs.facts.flatten(1).gather(1, pick[:, None]).squeeze(1), target)
    return FactObservations(facts, question, target, fact_mask, field_mask, question_mask)


def seeded_pick(seed):
    """``pick(options)``: one of ``options``, drawn from a generator seeded ``seed`` (the simulated stories' draws;
    ``pick.generator`` is that generator, for the other draws of the same story)."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    pick.generator = g
    return pick


def story_tensors(n, num_facts, num_fields, question_len):
    """``(facts (n, num_facts, num_fields), question (n, question_len), target (n,))`` of zeros, long: a simulated
    story's tensors, filled row by row."""
    return (torch.zeros(n, num_facts, num_fields, dtype=torch.long), torch.zeros(n, question_len, dtype=torch.long),
            torch.zeros(n, dtype=torch.long))


def random_fact_head(L, F, S, P, seed=0, scale=1.0, max_distance=3):
    """A float64 ``FactAttention`` with every parameter seeded standard normal times ``scale`` (``mention_slopes``
    negated where positive: the score holds them at or below 0, so a positive one would test nothing), and every
    other symbol a frame symbol (so that ``frame_content`` enters the scores beside the tables)."""
    from pyro_multihop import FactAttention
    from pyro_multihop.models.facts import PARAMETER_SHAPES

    g = torch.Generator().manual_seed(seed)
    head = FactAttention(L, F, S, max_question_len=P, max_distance=max_distance, dtype=torch.float64,
                         frame_symbols=torch.arange(S) % 2 == 0)
    with torch.no_grad():
        for name in PARAMETER_SHAPES:
            parameter = getattr(head, name)
            parameter.copy_(scale * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
        head.mention_slopes.copy_(-head.mention_slopes.abs())
    return head


def chained_as_fact_parameters(chained):
    """A ``ChainedAttention``'s parameters as a two-field facts head's (key, value) ``init``, detached: hop 1's
    ``question_tables[0, 0]`` its first score table, ``content_tables[:, 1, 0]`` the later ones, the value field's
    emission table its emission, every equality weight 0 (build the head with ``revisit=True``: a chained hop may
    attend the previous hop's position again, and the value field's copy off: ``emission_mix_probs``)."""
    L, S = chained.n_hops, chained.num_symbols
    scores = chained.gate_score_tables().detach()  # (L, S, S)
    question = torch.zeros(L, 2, S, S, dtype=scores.dtype)
    question[0, 0] = scores[0]
    content = torch.zeros(L - 1, 2, 2, S, S, dtype=scores.dtype)
    content[:, 1, 0] = scores[1:]
    emission = torch.zeros(2, S, chained.num_targets, dtype=scores.dtype)
    emission[1] = chained.emission_logits.detach()
    return {"question_tables": question, "content_tables": content, "emission_tables": emission,
            "emission_mix_probs": [0.0, 1.0, 0.0, 0.0], "question_equality": torch.zeros(L, 2, dtype=scores.dtype),
            "field_equality": torch.zeros(L - 1, 2, 2, dtype=scores.dtype)}


def checkpoint_without(head, names, folder):
    """The path of ``head``'s checkpoint as an earlier release wrote it: the parameters ``names`` missing from its
    state dict, and no digest (a file without one loads: written before digests existed; this one is edited)."""
    from pyro_multihop import save_checkpoint

    payload = torch.load(save_checkpoint(folder / "new.pt", head, step=0), weights_only=False)
    for name in names:
        del payload["state_dict"][name]
    del payload["sha256"]
    torch.save(payload, folder / "old.pt")
    return folder / "old.pt"


def seeded_normal(head, seed):
    """``head`` with every parameter drawn standard normal from a generator seeded ``seed`` (in place; returned), its
    ``mention_slopes`` made non-positive, as the head bounds them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=parameter.dtype))
        head.mention_slopes.copy_(-head.mention_slopes.abs())
    return head
