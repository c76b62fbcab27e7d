"""The structured-facts head's candidate terms: ``mention_slopes`` (recency among the facts that name the hop's chosen
question token) and ``fact_by_symbol`` (the candidate's own symbols). Their exactness is checked with every other
term against the brute-force oracle (``tests/facts_oracle.py``, in ``test_facts.py``); here, the features they read
and what they let the head learn."""

import torch

from pyro_multihop import FactAttention, FactObservations, fit_svi
from pyro_multihop.models.fact_features import FactFeatures
from pyro_multihop.models.fact_parameters import frame_symbols_of

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
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    facts = torch.zeros(n, num_facts, 3, dtype=torch.long)
    question = torch.zeros(n, 1, dtype=torch.long)
    target = torch.zeros(n, dtype=torch.long)
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
    field_mask = torch.tensor([[[True, True], [True, True], [True, True], [True, True], [True, True]]])
    field_mask[0, 2, 0] = False  # fact 2's field 0 is padding: it still names 7 in field 1
    field_mask[0, 3] = False  # fact 3 is padding
    obs = FactObservations(facts, torch.tensor([[7, 5, 7]]), torch.tensor([0]),
                           fact_mask=torch.tensor([[True, True, True, False, True]]), field_mask=field_mask,
                           question_mask=torch.tensor([[True, True, False]]))
    ages = FactFeatures(obs, num_symbols=8, max_distance=100, dtype=torch.float64).mention_ages()
    assert ages.tolist() == [[[2.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 5]]
    clipped = FactFeatures(obs, num_symbols=8, max_distance=1, dtype=torch.float64).mention_ages()
    assert clipped[0, 0].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_the_latest_move_is_learnt_for_entities_training_never_showed():
    """One hop must find the asked entity's latest *move*, passing over later facts of the kind that moves nobody
    and over earlier moves: the equality and age terms alone reach 0.71 on entities never seen in training (the
    latest fact naming the entity, `/tmp` script), the generating rule 1.0; with the candidate terms the defaults
    reach it."""
    train = latest_move_task(150, TRAIN_ENTITIES, seed=0)
    test = latest_move_task(300, TEST_ENTITIES, seed=1)
    frame = frame_symbols_of(train, NUM_SYMBOLS)  # the verbs and objects: no question or answer names them
    head = FactAttention(1, 3, NUM_SYMBOLS, max_question_len=1, dtype=torch.float64, frame_symbols=frame)
    fit_svi(head, train, progress=False, seed=0)
    accuracy = float((head.predict_proba(test).argmax(-1) == test.target).double().mean())
    assert accuracy >= 0.95, accuracy
    taking, moving = head.fact_by_symbol[0, TAKES].detach(), head.fact_by_symbol[0, MOVES].detach()
    assert float(taking.max()) < float(moving.min()), (taking, moving)
    assert float(head.mention_slopes[0]) < 0
