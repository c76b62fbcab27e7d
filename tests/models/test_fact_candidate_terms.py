"""The structured-facts head's terms of a candidate alone: the recency among mentions, ``min(mention_slopes[l], 0)
sum_m w_l[m] mention_age_j(q_m)`` (how many later facts name the hop's chosen question token too, where the candidate
names it), and the last hop's fact kind, ``sum_a last_fact_kind[f_j^a]`` over the candidate's frame symbols. Their
exactness is checked with every other term against the brute-force oracle (``tests/facts_oracle.py``, in
``test_facts.py``); here, the feature by hand, what the slope's bound means, and what the two let the head learn."""

import pytest
import torch

from pyro_multihop import FactAttention, FactObservations, fit_svi
from pyro_multihop.models.fact_features import FactFeatures
from pyro_multihop.models.fact_parameters import frame_symbols_of
from tests import factories

PLACES, OBJECTS = 5, 3
MOVES = [PLACES + OBJECTS + k for k in range(3)]
TAKES = [PLACES + OBJECTS + 3 + k for k in range(2)]
FIRST_ENTITY = PLACES + OBJECTS + 5
TRAIN_ENTITIES = list(range(FIRST_ENTITY, FIRST_ENTITY + 6))
TEST_ENTITIES = list(range(FIRST_ENTITY + 6, FIRST_ENTITY + 12))
NUM_SYMBOLS = FIRST_ENTITY + 12


def latest_move_task(n, entities, seed, num_facts=6):
    """Facts ``(entity, move verb, place)`` or ``(entity, take verb, object)``; the question names an entity that
    moved; the answer is the place of its latest move (taking an object moves nobody). The generating rule answers
    every question."""
    pick = factories.seeded_pick(seed)
    g = pick.generator
    facts, question, target = factories.story_tensors(n, num_facts, 3, 1)
    for row in range(n):
        while True:
            who = [pick(entities) for _ in range(num_facts)]
            moves = [bool(torch.rand(1, generator=g) < 0.5) for _ in range(num_facts)]
            asked = pick(who)
            moved = [i for i in range(num_facts) if who[i] == asked and moves[i]]
            if moved:
                break
        for i in range(num_facts):
            facts[row, i] = torch.tensor([who[i], pick(MOVES), pick(range(PLACES))] if moves[i]
                                         else [who[i], pick(TAKES), pick(range(PLACES, PLACES + OBJECTS))])
        question[row, 0] = asked
        target[row] = facts[row, moved[-1], 2]
    return FactObservations(facts, question, target)


def test_mention_ages_count_the_later_facts_that_name_the_token():
    """By hand: token ``7`` is named by facts 0, 2 and 4 (fact 3 is padded), token ``5`` by fact 1 only in a real
    field, a padded token by none."""
    facts = torch.tensor([[[7, 1], [2, 5], [3, 7], [7, 7], [1, 7]]])
    field_mask = torch.ones(1, 5, 2, dtype=torch.bool)
    field_mask[0, 2, 0] = False  # fact 2's field 0 is padding: it still names 7 in field 1
    field_mask[0, 3] = False  # fact 3 is padding
    obs = FactObservations(facts, torch.tensor([[7, 5, 7]]), torch.tensor([0]),
                           fact_mask=torch.tensor([[True, True, True, False, True]]), field_mask=field_mask,
                           question_mask=torch.tensor([[True, True, False]]))
    ages = FactFeatures(obs, num_symbols=8, max_distance=100, dtype=torch.float64).mention_ages()
    assert ages.tolist() == [[[2.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 5]]
    clipped = FactFeatures(obs, num_symbols=8, max_distance=1, dtype=torch.float64).mention_ages()
    assert clipped[0, 0].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def one_hop_head(slope):
    """A one-hop head over facts ``(who, where)`` that reads the question's one token by equality alone, with the
    given mention slope and every other score weight at 0."""
    head = FactAttention(1, 2, 6, max_question_len=1, dtype=torch.float64)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.zero_()
        head.question_equality.fill_(2.0)
        head.mention_slopes.fill_(slope)
    return head


@pytest.mark.parametrize("slope", [-1.5, 0.0, 1.5])
def test_the_slope_prefers_the_latest_mention_and_never_the_oldest(slope):
    """Token 1 is named by facts 0, 2 and 3 (ages among its mentions 2, 1, 0); fact 1 names token 2 only. Hop 1's
    posterior by hand: ``exp(2 + min(slope, 0) age)`` on the three, ``exp(0)`` on fact 1, so a positive slope is
    the slope 0: a hop can learn to prefer a token's latest fact, not its oldest (docs/facts.md)."""
    obs = FactObservations(torch.tensor([[[1, 3], [2, 4], [1, 5], [4, 1]]]), torch.tensor([[1]]), torch.tensor([0]))
    paths, log_probs = one_hop_head(slope).k_best_paths(obs, 4, given_target=False)  # the prior: every one-hop path
    prior = torch.zeros(4, dtype=torch.float64).index_put_((paths[0, :, 0],), log_probs[0].exp())
    effective = min(slope, 0.0)
    logits = torch.tensor([2 + 2 * effective, 0.0, 2 + effective, 2.0], dtype=torch.float64)
    assert torch.allclose(prior, torch.softmax(logits, 0), atol=1e-12, rtol=0)


def test_the_fact_kind_weighs_the_last_hops_frame_symbols_alone():
    """By hand, a two-hop head whose only non-zero weight is ``last_fact_kind``: hop 2's transition from any fact
    is ``softmax_j(sum of last_fact_kind over j's frame symbols)`` (entity symbols, not frame ones, add nothing),
    and hop 1 is uniform: the term is the last hop's alone."""
    frame = torch.tensor([False, False, True, True, False])
    head = FactAttention(2, 2, 5, max_question_len=1, dtype=torch.float64, frame_symbols=frame, revisit=True)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.zero_()
        head.last_fact_kind.copy_(torch.tensor([5.0, 5.0, 1.0, -1.0, 5.0]))
    obs = FactObservations(torch.tensor([[[0, 2], [1, 3], [4, 2], [0, 1]]]), torch.tensor([[4]]), torch.tensor([0]))
    paths, log_probs = head.k_best_paths(obs, 16, given_target=False)  # the prior over all 16 two-hop paths
    prior = torch.zeros(4, 4, dtype=torch.float64)
    prior[paths[0, :, 0], paths[0, :, 1]] = log_probs[0].exp()
    second = torch.softmax(torch.tensor([1.0, -1.0, 1.0, 0.0], dtype=torch.float64), 0)
    assert torch.allclose(prior, torch.full((4, 1), 0.25, dtype=torch.float64) * second, atol=1e-12, rtol=0)


def test_the_latest_move_is_learnt_for_entities_training_never_showed():
    """One hop must find the asked entity's latest *move*, passing over later facts of the kind that moves nobody
    and over earlier moves: without the candidate terms the head reaches 0.74 on entities never seen in training
    (the latest fact naming the entity, a `/tmp` script), the generating rule 1.0; with them the defaults reach it,
    through the fact kind (moves over takes) and a negative mention slope."""
    train = latest_move_task(150, TRAIN_ENTITIES, seed=0)
    test = latest_move_task(300, TEST_ENTITIES, seed=1)
    frame = frame_symbols_of(train, NUM_SYMBOLS)  # the verbs and objects: no question or answer names them
    head = FactAttention(1, 3, NUM_SYMBOLS, max_question_len=1, dtype=torch.float64, frame_symbols=frame)
    fit_svi(head, train, progress=False, seed=0)
    accuracy = float((head.predict_proba(test).argmax(-1) == test.target).double().mean())
    assert accuracy >= 0.95, accuracy
    taking, moving = head.last_fact_kind[TAKES].detach(), head.last_fact_kind[MOVES].detach()
    assert float(taking.max()) < float(moving.min()), (taking, moving)
    assert float(head.mention_slopes[0].detach()) < 0
