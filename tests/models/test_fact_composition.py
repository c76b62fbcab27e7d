"""The structured-facts head's composition of two facts (``composition``, :mod:`pyro_multihop.models.fact_composition`):
a yes / no from what two facts state together, mixed into the emission. Exactness against the brute-force oracle
(``tests/facts_oracle.py``: a loop over every ordered pair of facts, question token and field), with padding; the
ramp by hand; learning a simulated size-order task about entities training never showed; the checks of bad input."""

import pytest
import torch

from pyro_multihop import FactAttention, FactObservations, fit_svi
from pyro_multihop.checkpoint import load_checkpoint, save_checkpoint
from pyro_multihop.models import fact_composition
from tests import factories
from tests import facts_oracle as oracle

N, F, M, S, P = 4, 3, 3, 7, 3


def composition_head(L, seed=0, **options):
    """A float64 head with a composition of 2 dimensions, every parameter seeded standard normal."""
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, composition=2, **options)
    return factories.seeded_normal(head, seed)


def one_fact_in_row_0(obs):
    """``obs`` with row 0's facts but its first real one padded: a row whose pair is the fact with itself."""
    fact_mask = obs.full_mask().clone()
    keep = int(fact_mask[0].nonzero()[0])
    fact_mask[0] = False
    fact_mask[0, keep] = True
    field_mask = obs.real_fields() & fact_mask.unsqueeze(-1)
    question_mask = obs.real_tokens()
    return FactObservations(obs.facts.masked_fill(~field_mask, -1), obs.question.masked_fill(~question_mask, -1),
                            obs.target, fact_mask, field_mask, question_mask)


@pytest.fixture(scope="module", params=[(1, True), (2, True), (2, False)], ids=lambda p: f"L{p[0]}-{p[1]}")
def composition_case(request):
    L, padded = request.param
    head = composition_head(L, seed=L)
    obs = factories.random_fact_observations(5, N, F, M, S, seed=60 + L, padded=padded)
    if padded:
        obs = one_fact_in_row_0(obs)
    return head, obs


def test_likelihood_predictive_marginals_and_map_equal_the_oracles(composition_case):
    head, obs = composition_case
    tables, predictive = oracle.path_tables(head, obs)
    oracle.assert_likelihood_exact(head, obs, oracle.log_likelihood(tables))
    proba = head.predict_proba(obs)
    assert torch.allclose(proba, torch.stack(predictive), atol=1e-9, rtol=0)
    assert torch.allclose(proba.sum(-1), torch.ones(len(obs), dtype=torch.float64), atol=1e-9)
    oracle.assert_marginals_and_map_exact(head, obs, oracle.summaries(tables, N, head.n_hops))
    before = head.log_likelihood(obs)
    with torch.no_grad():  # the composition's share moves the likelihood
        saved = head.composition_mix.clone()
        head.composition_mix.fill_(-40.0)
        assert not torch.allclose(head.log_likelihood(obs), before, atol=1e-6)
        head.composition_mix.copy_(saved)


@pytest.mark.parametrize("L", [1, 2])
def test_gradients_and_pyro_losses_equal_the_oracles(L):
    head = composition_head(L, seed=7)
    obs = factories.random_fact_observations(4, N, F, M, S, seed=70 + L)
    oracle.assert_gradients_exact(head, obs, fact_composition.COMPOSITION_SHAPES)


def test_the_question_sides_are_a_ramp_shared_past_the_last_position():
    sides = fact_composition.question_sides(6, 5, torch.float64)
    assert torch.equal(sides, torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, -1.0], dtype=torch.float64))
    assert torch.equal(fact_composition.question_sides(2, 1), torch.ones(2))


def test_a_pair_score_by_hand():
    """Facts (5, 0, 6) "5 is bigger than 6" and (6, 0, 4) over the question (5, 2, 4): with the relation's vector
    (1, 0) on symbol 0, the question's (1, 0) on symbol 2, a gate of 1 and the field sides (1, 0, -1), token 5 stands
    first in the question (+1) and first in fact 0 (+1), token 4 last in both (-1 times -1): ``a = 2 tanh(3)``."""
    gate = torch.ones(S, dtype=torch.float64)
    side = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    relation = torch.zeros(S, 2, dtype=torch.float64)
    relation[0] = torch.tensor([1.0, 0.0])
    asked = torch.zeros(S, 2, dtype=torch.float64)
    asked[2] = torch.tensor([1.0, 0.0])
    fields = torch.tensor([[[5, 0, 6], [6, 0, 4]]])
    question = torch.tensor([[5, 2, 4]])
    a, pairs = fact_composition.pair_scores(fields, torch.ones(1, 2, 3, dtype=torch.bool), question,
                                            torch.ones(1, 3, dtype=torch.bool), gate, side, relation, asked, 3)
    expected = 2 * torch.tanh(torch.tensor(3.0, dtype=torch.float64))
    assert torch.allclose(a[0, 0, 1], expected) and torch.allclose(a[0, 1, 0], expected)
    assert pairs.tolist() == [[[False, True], [True, False]]]


def order_task(n, entities, seed, distractors=1):
    """Two facts relate A to C and C to B in a chain of sizes (A > C > B or A < C < B), each written either way round
    (``(x, BIG, y)``: x is bigger), among ``distractors`` facts of other entities, shuffled; the question
    ``(A, asked, B)`` asks whether A is bigger (``Q_BIG``) or smaller than B; the answer ``YES`` or ``NO``. Symbols
    0-5 are the words, ``entities`` the rest."""
    big, small, q_big, q_small, yes, no = range(6)
    pick = factories.seeded_pick(seed)
    g = pick.generator
    facts, questions, targets = [], [], []
    for _ in range(n):
        chosen = [entities[k] for k in torch.randperm(len(entities), generator=g)[:3 + 2 * distractors].tolist()]
        A, C, B = chosen[:3]
        a_bigger = bool(torch.rand(1, generator=g) < 0.5)

        def stated(x, y, x_bigger):
            return [x, big if x_bigger else small, y] if bool(torch.rand(1, generator=g) < 0.5) else \
                [y, small if x_bigger else big, x]

        story = [stated(A, C, a_bigger), stated(C, B, a_bigger)]
        story += [stated(chosen[3 + 2 * k], chosen[4 + 2 * k], bool(torch.rand(1, generator=g) < 0.5))
                  for k in range(distractors)]
        facts.append([story[k] for k in torch.randperm(len(story), generator=g).tolist()])
        asked = pick([q_big, q_small])
        questions.append([A, asked, B])
        targets.append(yes if a_bigger == (asked == q_big) else no)
    return FactObservations(torch.tensor(facts), torch.tensor(questions), torch.tensor(targets))


def test_the_composition_learns_a_size_order_about_unseen_entities():
    """The answer is a function of two facts together, so no emission of one fact can give it: the head without the
    composition stays near chance on entities training never showed; with it, it answers as the rule does (1.0)."""
    train = order_task(200, list(range(6, 26)), seed=0)
    test = order_task(300, list(range(26, 46)), seed=1)
    accuracy = {}
    for composition in (2, None):
        head = FactAttention(1, 3, 46, max_question_len=3, composition=composition, answer_symbols=[4, 5],
                             comparison=True)
        options = {**head.svi_defaults(), "num_steps": 300}
        fit_svi(head, train, **options)
        with torch.no_grad():
            accuracy[composition] = float((head.predict_proba(test).argmax(-1) == test.target).double().mean())
    assert accuracy[2] >= 0.95, accuracy
    assert accuracy[None] < 0.7, accuracy


def test_a_checkpoint_keeps_the_composition(tmp_path):
    head = composition_head(2, seed=3)
    obs = factories.random_fact_observations(4, N, F, M, S, seed=80)
    loaded, _ = load_checkpoint(save_checkpoint(tmp_path / "composition.pt", head, step=0))
    assert loaded.uses_composition and loaded.config()["composition"] == 2
    assert "composition=2" in repr(loaded)
    assert torch.allclose(loaded.log_likelihood(obs), head.log_likelihood(obs), atol=1e-12, rtol=0)


@pytest.mark.parametrize("composition", [0, -1, 2.0, True, "2"])
def test_bad_compositions_are_refused(composition):
    with pytest.raises(ValueError, match=f"composition must be a positive int .* got {composition!r}"):
        FactAttention(1, F, S, composition=composition)


def test_a_composition_and_an_answer_per_hop_are_refused_together():
    with pytest.raises(ValueError, match="composition and answer_parts cannot both be given"):
        FactAttention(2, F, S, composition=2, answer_parts={5: [0, 1], 6: [1, 0]})


def test_an_embedded_head_with_answers_and_a_register_composes_in_every_form():
    """An embedded head whose learnt emission gives three answers, with a register too: the composition is over
    those answers; the prediction is a distribution, and at each target it is the likelihood (the engine's mixture
    and its target form agree)."""
    head = FactAttention(2, F, S, max_question_len=P, dtype=torch.float64, embed_dim=4, seed=0,
                         answer_symbols=[0, 4, 6], composition=3, register={"counts": 2, "lists": []})
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=torch.float64))
    assert head.composition_out.shape == (3,) and head.composition_relation.shape == (S, 3)
    obs = factories.random_fact_observations(4, N, F, M, S, seed=90)
    proba = head.predict_proba(obs)
    assert torch.allclose(proba.sum(-1), torch.ones(len(obs), dtype=torch.float64), atol=1e-9)
    for symbol in (0, 2, 4):
        at = obs.with_target(torch.full_like(obs.target, symbol))
        assert torch.allclose(head.log_likelihood(at).exp(), proba[:, symbol], atol=1e-9, rtol=0)


def test_starts_one_to_three_are_the_composition_alone_and_the_head_own_starts_follow_without_it():
    """``fit_svi(starts=K)``'s starts 1-3 of a head with a composition are the composition alone (its share 1 but
    ``exp(-30)``: the likelihood is the composition's), start 1 from the head's symbol vectors, starts 2 and 3 from
    draws 1 and 2 (other vectors, the rest of the head as it was); start 4 the head's own start without it: the
    likelihood and every gradient those of the same head built without a composition, the composition's gradients
    exactly 0; starts 5.. the head's other starts without it, in their order, setting what they set without it."""
    obs = factories.random_fact_observations(4, N, F, M, S, seed=95)
    start = {name: value.clone() for name, value in composition_head(1, seed=4, comparison=True).state_dict().items()}
    alone = fact_composition.COMPOSITION_ALONE_STARTS
    assert alone == 3 and fact_composition.COMPOSITION_EXTRA_STARTS == alone + 1
    for variant in range(1, alone + 1):
        head = composition_head(1, seed=4, comparison=True)
        said = head.start_variant(variant)
        assert said == "the composition alone" + ("" if variant == 1 else
                                                  f" and its symbol vectors from draw {variant - 1}")
        assert head.composition_mix.item() == fact_composition.ALONE_START
        assert torch.allclose(head.log_likelihood(obs), head.composition_target_log_probs(obs), atol=1e-9, rtol=0)
        redrawn = {"composition_relation", "composition_question"} if variant > 1 else set()
        for name, value in head.state_dict().items():
            if name != "composition_mix":
                assert torch.equal(value, start[name]) == (name not in redrawn), (variant, name)
        if redrawn:
            expected = fact_composition.symbol_vectors(S, 2, variant - 1, torch.float64)
            assert torch.equal(head.composition_relation, expected[0])
            assert torch.equal(head.composition_question, expected[1])
    shared = {name: value for name, value in start.items() if not name.startswith("composition_")}
    for variant in range(alone + 1, alone + 9):
        head = composition_head(1, seed=4, comparison=True)
        plain = FactAttention(1, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, comparison=True)
        plain.load_state_dict(shared)
        said = head.start_variant(variant)
        plain_said = plain.start_variant(variant - alone - 1)
        assert said == "the emission without its composition" + ("" if plain_said is None else f" and {plain_said}")
        assert head.word_order == plain.word_order
        for name, value in plain.state_dict().items():
            assert torch.equal(head.state_dict()[name], value), (variant, name)
        loss, plain_loss = -head.log_likelihood(obs).sum(), -plain.log_likelihood(obs).sum()
        assert torch.equal(loss, plain_loss)
        loss.backward()
        plain_loss.backward()
        plain_grads = {name: parameter.grad for name, parameter in plain.named_parameters()}
        for name, parameter in head.named_parameters():  # None: a parameter out of the likelihood in both
            if name.startswith("composition_"):
                assert parameter.grad is not None and not parameter.grad.any(), (variant, name)
            elif plain_grads[name] is None:
                assert parameter.grad is None or not parameter.grad.any(), (variant, name)
            else:
                assert torch.equal(parameter.grad, plain_grads[name]), (variant, name)
    assert composition_head(1, seed=4, comparison=True).start_variant(alone + 9) is None
