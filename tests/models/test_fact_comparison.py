"""The comparison component of FactAttention's emission (models/fact_comparison.py): exact against brute-force
enumeration (tests/facts_oracle.py) with the comparison switched on, for the table and the embedded head, in
float64 with padding; a hand-set one-hop head that answers a synthetic yes / no task for symbols never seen;
the comparison switched off exactly; old checkpoints refused with a clear message."""

import pytest
import torch

from pyro_multihop import FactAttention, FactObservations, fact_chain_task, load_checkpoint, save_checkpoint
from pyro_multihop.checkpoint import CheckpointError
from pyro_multihop.models.fact_comparison import COMPARISON_SHAPES
from tests import factories
from tests import facts_oracle as oracle

N, F, M, S, P = 4, 3, 3, 6, 4


def compare_heavy_head(L, seed, embed_dim=None):
    """A float64 head with every parameter random and the comparison weighing most of the emission."""
    g = torch.Generator().manual_seed(seed)
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=embed_dim)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(0.8 * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
        head.emission_mix[-1] = 3.0
        head.compare_logits.mul_(4)
    return head


def oracle_tables(head):
    """The parameters the oracle reads: the head's own, or for an embedded head the tables they stand for."""
    p = {name: value.detach() for name, value in head.named_parameters()}
    if head.embed_dim is not None:
        E, O = p["symbol_embedding"], p["output_embedding"]
        p["question_tables"] = torch.einsum("sd,lbde,te->lbst", E, p["question_bilinear"], E)
        p["content_tables"] = torch.einsum("sd,labde,te->labst", E, p["content_bilinear"], E)
        p["emission_tables"] = torch.einsum("sd,ade,te->ast", E, p["emission_bilinear"], O) + p["answer_bias"]
    return p


@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("embed_dim", [None, 4], ids=["tables", "embedded"])
def test_the_comparison_is_exact(L, embed_dim):
    """Likelihood (one chunk and one row a chunk), hop marginals, MAP paths and predictions equal brute force with
    the comparison on; and the comparison changes them (it is not switched off)."""
    head = compare_heavy_head(L, seed=L + (7 if embed_dim else 0), embed_dim=embed_dim)
    obs = factories.random_fact_observations(5, N, F, M, S, seed=30 + L, padded=True)
    tables, predictive = oracle.path_tables(head, obs, oracle_tables(head))
    expected = oracle.log_likelihood(tables)
    summary = oracle.summaries(tables, N, L)
    assert torch.allclose(head.log_likelihood(obs), expected, atol=1e-9, rtol=0)
    assert torch.allclose(head.log_likelihood(obs, budget=1), expected, atol=1e-9, rtol=0)
    assert torch.allclose(head.hop_marginals(obs), summary["hop_marginals"], atol=1e-9, rtol=0)
    assert torch.allclose(head.hop_marginals(obs, budget=1), summary["hop_marginals"], atol=1e-9, rtol=0)
    assert torch.equal(head.map_paths(obs), summary["map_given"])
    assert torch.allclose(head.predict_proba(obs), torch.stack(predictive), atol=1e-9, rtol=0)
    with torch.no_grad():
        head.compare_logits.zero_()
    assert not torch.allclose(head.log_likelihood(obs), expected, atol=1e-3)


def test_gradients_of_the_comparison_equal_the_oracles():
    head = compare_heavy_head(2, seed=3)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=12, padded=True)
    params = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    oracle.log_likelihood(oracle.path_tables(head, obs, params)[0]).sum().backward()
    head.log_likelihood(obs, budget=1).sum().backward()
    for name in COMPARISON_SHAPES:
        assert torch.allclose(getattr(head, name).grad, params[name].grad, atol=1e-9, rtol=0), name
        assert getattr(head, name).grad.abs().sum() > 0, name


def test_two_f_mix_probabilities_switch_the_comparison_off_exactly():
    """``emission_mix_probs`` of ``2 F`` entries (as before the comparison): its weight is exactly 0, whatever
    its other parameters, and its parameters get no gradient."""
    head = factories.random_fact_head(2, F, S, P, seed=1)
    probs = torch.rand(2 * F, dtype=torch.float64)
    init = {name: value.detach() for name, value in head.named_parameters() if name != "emission_mix"}
    off = FactAttention(2, F, S, max_question_len=P, max_distance=3, dtype=torch.float64,
                        init={**init, "emission_mix_probs": probs / probs.sum()})
    plain = FactAttention(2, F, S, max_question_len=P, max_distance=3, dtype=torch.float64,
                          init={**{k: v for k, v in init.items() if k not in COMPARISON_SHAPES},
                                "emission_mix_probs": probs / probs.sum()})
    obs = factories.random_fact_observations(4, N, F, M, S, seed=5)
    assert torch.equal(off.log_likelihood(obs), plain.log_likelihood(obs))
    assert torch.equal(off.predict_proba(obs), plain.predict_proba(obs))
    off.log_likelihood(obs).sum().backward()
    for name in COMPARISON_SHAPES:  # not computed at all where the component weighs nothing (None), else 0
        grad = getattr(off, name).grad
        assert grad is None or grad.abs().sum() == 0, name


def yes_no_task(n, seed, symbols):
    """Rows of facts ``(person, moved, place)``, up to 6 of them (padded facts at the end), and the question
    ``(is, person, in, place)``: the answer is ``yes`` iff the person's last fact names that place (half the rows).
    ``symbols``: a permutation of the vocabulary, so that every word is relabelled."""
    g = torch.Generator().manual_seed(seed)
    is_, in_, moved, yes, no = 0, 1, 2, 3, 4
    persons, places = torch.arange(5, 15), torch.arange(15, 30)
    rows, questions, targets, masks, lasts = [], [], [], [], []
    for _ in range(n):
        count = int(torch.randint(1, 7, (1,), generator=g))
        who = persons[torch.randint(len(persons), (6,), generator=g)]
        where = places[torch.randint(len(places), (6,), generator=g)]
        facts = torch.stack([who, torch.full((6,), moved), where], -1)
        person = int(who[int(torch.randint(count, (1,), generator=g))])
        last = max(k for k in range(count) if int(who[k]) == person)
        asked = int(where[last]) if torch.rand(1, generator=g) < 0.5 else \
            int(places[torch.randint(len(places), (1,), generator=g)])
        rows.append(facts)
        questions.append(torch.tensor([is_, person, in_, asked]))
        targets.append(yes if asked == int(where[last]) else no)
        lasts.append(last)
        masks.append(torch.arange(6) < count)
    relabel = lambda t: symbols[t]  # noqa: E731
    return FactObservations(relabel(torch.stack(rows)), relabel(torch.stack(questions)), relabel(torch.tensor(targets)),
                            fact_mask=torch.stack(masks), supporting=torch.tensor(lasts)[:, None]), symbols[yes], symbols[no]


def yes_no_head(num_symbols, yes, no):
    """One hop: attend the last fact whose field 0 equals question token 1; answer by comparing question token 3
    with field 2 (``yes`` if equal, ``no`` otherwise), the comparison alone in the emission. Only the two answer
    symbols are named; no other symbol has a weight of its own."""
    float64 = dict(dtype=torch.float64)
    position = torch.full((1, 4), -100.0, **float64)
    position[0, 1] = 0.0
    compare_position = torch.full((4,), -100.0, **float64)
    compare_position[3] = 0.0
    question_equality = torch.zeros(1, 3, **float64)
    question_equality[0, 0] = 1000.0
    compare_logits = torch.zeros(3, num_symbols, **float64)
    compare_logits[2, yes] = 60.0
    compare_bias = torch.zeros(num_symbols, **float64)
    compare_bias[no] = 30.0
    init = {"question_position": position, "question_equality": question_equality,
            "age_slopes": torch.tensor([-400.0], **float64), "compare_position": compare_position,
            "compare_logits": compare_logits, "compare_bias": compare_bias,
            "emission_mix_probs": [0.0] * 6 + [1.0]}
    return FactAttention(1, 3, num_symbols, max_question_len=4, dtype=torch.float64, init=init)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_hand_set_head_answers_yes_no_for_any_symbols(seed):
    """Every word relabelled at random (persons and places never seen by the hand-set weights): the head answers
    every row right, with probability 1 up to rounding, and attends the person's last fact."""
    symbols = torch.randperm(30, generator=torch.Generator().manual_seed(seed))
    obs, yes, no = yes_no_task(200, seed, symbols)
    assert 0.3 < float((obs.target == yes).double().mean()) < 0.7
    head = yes_no_head(30, int(yes), int(no))
    proba = head.predict_proba(obs).detach()
    assert torch.equal(proba.argmax(-1), obs.target)
    assert float(proba.gather(1, obs.target[:, None]).min()) > 1 - 1e-9
    assert head.evaluate(obs)["accuracy"] == 1.0
    assert torch.equal(head.map_paths(obs, given_target=False), obs.supporting)


def test_an_old_checkpoint_is_refused_with_the_reason(tmp_path):
    """A checkpoint of the head before the comparison (``emission_mix`` of ``2 F`` entries, no ``compare_*``):
    a CheckpointError that says so, not a missing-key message."""
    head = FactAttention(2, 3, 68, max_question_len=3)
    path = save_checkpoint(tmp_path / "new.pt", head, step=0)
    payload = torch.load(path, weights_only=False)
    state = payload["state_dict"]
    for name in COMPARISON_SHAPES:
        del state[name]
    state["emission_mix"] = state["emission_mix"][:6]
    del payload["sha256"]  # a file without a digest loads (written before it existed); this one is edited
    torch.save(payload, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="before FactAttention's emission had its comparison component"):
        load_checkpoint(tmp_path / "old.pt")
    restored, _ = load_checkpoint(path)
    obs = fact_chain_task(10, num_facts=4, seed=0)
    assert torch.equal(restored.log_likelihood(obs), head.log_likelihood(obs))


def test_the_comparison_is_off_by_default_exactly_and_on_when_asked(tmp_path):
    """Off (the default), the component's mixture weight and every compare_* gradient are exactly 0, so the
    likelihood is that of the same head with the tables and copies alone (init of 2 F mix probabilities); on,
    the component weighs as much as each other one at the start, and the choice survives a checkpoint."""
    obs = fact_chain_task(20, seed=0)
    off = FactAttention(2, 3, obs.num_symbols, max_question_len=3, dtype=torch.float64)
    mix = off.emission_mix.softmax(-1)
    assert mix[-1] == 0 and torch.allclose(mix[:-1], torch.full((6,), 1 / 6, dtype=torch.float64))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in off.named_parameters():
            if name != "emission_mix":
                parameter.normal_(0, 0.5)
    two_components = FactAttention(2, 3, obs.num_symbols, max_question_len=3, dtype=torch.float64,
                                   init={"emission_mix_probs": [1 / 6] * 6})
    two_components.load_state_dict({k: v for k, v in off.state_dict().items() if k != "emission_mix"}, strict=False)
    assert torch.allclose(off.log_likelihood(obs), two_components.log_likelihood(obs), atol=1e-12)
    off.log_likelihood(obs).sum().backward()
    assert off.emission_mix.grad[-1] == 0
    assert all(getattr(off, name).grad is None or not getattr(off, name).grad.any() for name in COMPARISON_SHAPES)
    on = FactAttention(2, 3, obs.num_symbols, max_question_len=3, comparison=True)
    assert torch.allclose(on.emission_mix.softmax(-1), torch.full((7,), 1 / 7))
    assert on.config()["comparison"] is True and "comparison" not in off.config()
    save_checkpoint(tmp_path / "on.pt", on)
    assert load_checkpoint(tmp_path / "on.pt")[0].comparison is True


def test_a_checkpoint_without_the_flip_loads_as_the_head_it_was(tmp_path):
    """A checkpoint written before the comparison's flip (no ``compare_flip``, ``compare_flip_logits``) loads with
    the flip's weights at 0, the comparison it was trained with: its likelihood equals the saved head's with its
    flip weights set to 0 (brute force checks that head), and not the head's own, whose flip weighs."""
    head = compare_heavy_head(2, seed=4)
    obs = factories.random_fact_observations(5, N, F, M, S, seed=8, padded=True)
    old, _ = load_checkpoint(factories.checkpoint_without(head, ("compare_flip", "compare_flip_logits"), tmp_path))
    assert float(old.compare_flip_logits.abs().max()) == 0
    with torch.no_grad():
        head.compare_flip_logits.zero_()
    expected = oracle.log_likelihood(oracle.path_tables(head, obs, oracle_tables(head))[0])
    assert torch.allclose(old.log_likelihood(obs), expected, atol=1e-9, rtol=0)
    restored, _ = load_checkpoint(save_checkpoint(tmp_path / "kept.pt", compare_heavy_head(2, seed=4), step=0))
    assert not torch.allclose(restored.log_likelihood(obs), expected, atol=1e-6)  # a stored flip is kept


def test_the_flip_lets_a_fact_symbol_turn_a_match_into_a_no():
    """Set by hand: a one-hop head whose comparison says *yes* where the fact's field 2 equals the question's last
    token, unless the fact holds a flipping symbol, then *no*; for symbols never seen, on rows built here."""
    yes, no, flip, plain = 0, 1, 2, 3  # answers and the flipping word; places are 10..19
    num_symbols = 20
    head = FactAttention(1, 3, num_symbols, max_question_len=2, dtype=torch.float64, comparison=True)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.zero_()
        head.emission_mix[:-1] = -60.0  # the comparison alone
        head.compare_position[1] = 40.0  # the question's second token
        head.compare_bias[no] = 5.0
        head.compare_logits[2, yes] = 10.0  # a match says yes ...
        head.compare_flip[flip] = 1.0
        head.compare_flip_logits[2, yes] = -20.0  # ... unless the flipping word is in the fact
    facts = torch.tensor([[[5, flip, 12]], [[5, plain, 12]], [[5, plain, 13]], [[5, flip, 13]]])
    question = torch.tensor([[5, 12]] * 4)
    obs = FactObservations(facts, question, torch.tensor([no, yes, no, no]))
    predicted = head.predict_proba(obs).argmax(-1)
    assert predicted.tolist() == [no, yes, no, no]
    with torch.no_grad():
        head.compare_flip_logits.zero_()
    assert head.predict_proba(obs).argmax(-1).tolist() == [yes, yes, no, no]  # without it the negation says yes
