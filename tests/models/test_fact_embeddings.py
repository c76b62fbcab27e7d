"""FactAttention with symbol embeddings (``embed_dim=D``) against brute-force enumeration of every hop path
(tests/facts_oracle.py, fed the ``S x S`` tables that the embeddings stand for), against the table head (``E`` the
identity), and without any ``S x S`` tensor; in float64."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pyro_multihop import FactAttention, fact_chain_task, fact_chain_truth, fit_svi
from pyro_multihop.models.facts import PARAMETER_SHAPES, parameter_elements, parameter_shapes
from tests import factories
from tests import facts_oracle as oracle

N, F, M, S, P, D = 4, 3, 3, 6, 4, 5


def random_embedded_head(L, symbols=S, dim=D, seed=0, scale=0.7):
    """A float64 embedded ``FactAttention`` with every parameter seeded standard normal times ``scale``."""
    g = torch.Generator().manual_seed(seed)
    head = FactAttention(L, F, symbols, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=dim)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
    return head


def oracle_parameters(head):
    """The table head's parameters that the embedded head stands for, differentiable in its own (leaf copies)."""
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    E, O = leaves["symbol_embedding"], leaves["output_embedding"]
    tables = dict(leaves)
    tables["question_tables"] = torch.einsum("sd,lbde,te->lbst", E, leaves["question_bilinear"], E)
    tables["content_tables"] = torch.einsum("sd,labde,te->labst", E, leaves["content_bilinear"], E)
    tables["emission_tables"] = torch.einsum("sd,ade,te->ast", E, leaves["emission_bilinear"], O) + leaves["answer_bias"]
    return leaves, tables


@pytest.fixture(scope="module", params=[(1, True), (2, True), (3, True), (2, False)],
                ids=lambda p: f"L{p[0]}-{'padded' if p[1] else 'full'}")
def case(request):
    L, padded = request.param
    head = random_embedded_head(L, seed=L)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=L + 20, padded=padded)
    leaves, tables = oracle_parameters(head)
    paths, predictive = oracle.path_tables(head, obs, tables)
    return head, obs, leaves, paths, predictive


def test_likelihood_marginals_and_predictions_equal_the_oracles(case):
    head, obs, _, paths, predictive = case
    expected = oracle.log_likelihood(paths).detach()
    assert torch.allclose(head.log_likelihood(obs), expected, atol=1e-9, rtol=0)
    assert torch.allclose(head.log_likelihood(obs, budget=1), expected, atol=1e-9, rtol=0)  # one row, one answer a block
    summary = oracle.summaries([{k: (a.detach(), b.detach()) for k, (a, b) in t.items()} for t in paths], N, head.n_hops)
    assert torch.allclose(head.hop_marginals(obs), summary["hop_marginals"], atol=1e-9, rtol=0)
    assert torch.allclose(head.hop_marginals(obs, budget=1), summary["hop_marginals"], atol=1e-9, rtol=0)
    assert torch.allclose(head.predict_proba(obs), torch.stack(predictive).detach(), atol=1e-9, rtol=0)
    assert torch.equal(head.map_paths(obs), summary["map_given"])


def test_gradients_equal_the_oracles(case):
    head, obs, leaves, paths, _ = case
    head.zero_grad()
    for leaf in leaves.values():
        leaf.grad = None
    oracle.log_likelihood(paths).sum().backward(retain_graph=True)
    for budget in (None, 1):  # one block of answers, and one answer a block (LogNormaliser's backward)
        head.zero_grad()
        head.log_likelihood(obs, budget=budget).sum().backward()
        for name, parameter in head.named_parameters():
            if parameter.numel() == 0:  # the previous-fact terms of L = 1
                continue
            assert torch.allclose(parameter.grad, leaves[name].grad, atol=1e-9, rtol=0), name
            assert parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("L", [1, 2, 3])
def test_identity_embeddings_give_the_table_head(L):
    """``D = S``, ``E`` = ``O`` = the identity (padding row zero), the bilinear forms = the table head's tables, no
    bias: the same log-likelihood, and the same gradients of every shared parameter and of each table (its form's)."""
    table = factories.random_fact_head(L, F, S, P, seed=L + 3)
    table.frame_symbols.zero_()  # no frame symbol: an embedded head has no frame table
    init = {name: value.detach() for name, value in table.named_parameters() if name not in ("question_tables",
            "content_tables", "emission_tables", "frame_content", "last_fact_kind")}
    eye = torch.eye(S, dtype=torch.float64)
    init.update(symbol_embedding=eye, output_embedding=eye, question_bilinear=table.question_tables.detach(),
                content_bilinear=table.content_tables.detach(), emission_bilinear=table.emission_tables.detach())
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=S, init=init)
    obs = factories.random_fact_observations(4, N, F, M, S, seed=L + 30)
    expected, got = table.log_likelihood(obs), head.log_likelihood(obs)
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)
    expected.sum().backward()
    got.sum().backward()
    for name, parameter in table.named_parameters():
        # the previous-fact terms of L = 1; the terms of the frame symbols, of which there are none
        if parameter.numel() == 0 or name in ("frame_content", "last_fact_kind"):
            continue
        other = {"question_tables": "question_bilinear", "content_tables": "content_bilinear",
                 "emission_tables": "emission_bilinear"}.get(name, name)
        assert torch.allclose(getattr(head, other).grad, parameter.grad, atol=1e-10, rtol=0), name
    assert torch.allclose(head.predict_proba(obs), table.predict_proba(obs), atol=1e-10, rtol=0)


class _LargestStorage(TorchDispatchMode):
    """Records the most elements that the storage of any tensor an operation returns holds (a view or an expanded
    tensor counts what it allocates)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.untyped_storage().nbytes() // value.element_size())
        return out


def test_no_operation_forms_an_s_by_s_tensor():
    """S = 3000: training, marginals and predictions of the embedded head never return a tensor of ``S^2 / 10``
    elements (the largest are the ``(c, N, S)`` predictions and the ``(S, D)`` embeddings)."""
    symbols = 3000
    head = FactAttention(2, F, symbols, max_question_len=P, embed_dim=8, dtype=torch.float64)
    obs = factories.random_fact_observations(6, N, F, M, symbols, seed=1)
    with _LargestStorage() as mode:
        head.log_likelihood(obs).sum().backward()
        head.hop_marginals(obs)
        head.predict_proba(obs)
    assert mode.largest < symbols * symbols / 10, mode.largest
    assert mode.largest <= 6 * N * F * symbols  # the rows of the normaliser's block of answers


def test_parameter_counts():
    L, S2, P2, D2 = 3, 1000, 5, 16
    tables, embedded = parameter_elements(L, F, S2, P2), parameter_elements(L, F, S2, P2, embed_dim=D2)
    assert sum(tables.values()) - sum(embedded.values()) == \
        (L * F + (L - 1) * F * F + F) * (S2 * S2 - D2 * D2) - 2 * S2 * D2 - S2 + (L - 1) * S2 * S2 \
        + S2  # the frame table and last_fact_kind
    head = FactAttention(L, F, 50, max_question_len=P2, embed_dim=D2)
    assert {name: p.numel() for name, p in head.named_parameters()} == parameter_elements(L, F, 50, P2, embed_dim=D2)
    assert sorted(name for name, _ in head.named_parameters()) == sorted(parameter_shapes(D2))
    assert parameter_shapes() == PARAMETER_SHAPES and not set(parameter_shapes(D2)) & {"question_tables", "emission_tables"}


def test_the_start_attends_by_equality_alone_and_the_seed_draws_the_embeddings():
    """At the start only the equality terms score (at EQUALITY_START: with the question at every hop, with the
    previous fact from hop 2 on), and hop 2 never returns to hop 1's fact."""
    from pyro_multihop.models.fact_parameters import EQUALITY_START

    obs = factories.random_fact_observations(3, N, F, M, S, seed=2, padded=False)
    head = FactAttention(2, F, S, max_question_len=P, embed_dim=D, dtype=torch.float64, seed=1)
    first = torch.zeros(3, N, dtype=torch.float64)
    later = torch.zeros(3, N, N, dtype=torch.float64)
    for row in range(3):
        question = obs.question[row].tolist()
        for j in range(N):
            matches = sum(q == int(obs.facts[row, j, b]) for q in question for b in range(F))
            first[row, j] = EQUALITY_START * matches / len(question)  # the tokens weigh 1 / M each
            for i in range(N):
                shared = sum(int(obs.facts[row, i, a]) == int(obs.facts[row, j, b]) for a in range(F) for b in range(F))
                later[row, i, j] = first[row, j] + EQUALITY_START * shared if i != j else -float("inf")
    chain = head.hop_chain(obs)
    assert torch.allclose(chain.init.exp(), first.softmax(-1), atol=1e-12)
    assert torch.allclose(chain.trans[0].exp(), later.softmax(-1), atol=1e-12)
    again = FactAttention(2, F, S, max_question_len=P, embed_dim=D, dtype=torch.float64, seed=1)
    other = FactAttention(2, F, S, max_question_len=P, embed_dim=D, dtype=torch.float64, seed=2)
    assert torch.equal(head.symbol_embedding, again.symbol_embedding)
    assert not torch.equal(head.symbol_embedding, other.symbol_embedding)
    assert head.symbol_embedding.abs().min() > 0 and head.content_bilinear.abs().max() == 0
    assert head.config()["embed_dim"] == D and "embed_dim" not in FactAttention(2, F, S).config()
    with pytest.raises(ValueError, match="embed_dim must be a positive integer"):
        FactAttention(2, F, S, embed_dim=0)
    with pytest.raises(ValueError, match="init names unknown parameters"):
        FactAttention(2, F, S, embed_dim=D, init={"question_tables": torch.zeros(2, F, S, S)})


def test_svi_learns_the_chain_task_and_carries_it_to_unseen_entities():
    """fit_svi (collapsed, the head's defaults, D = 16, 300 steps) on 2,000 rows of ``fact_chain_task``: the training
    rows, and held-out rows over entities training never showed, are answered as the generating structure answers
    them (measured: 1.0 and 1.0; at the start, under uniform attention, few are). With the decay of the table head
    (3e-2) on the embeddings both stay near 0.89 (svi_defaults)."""
    train, test = fact_chain_task(2000, seed=0), fact_chain_task(300, entities="test", seed=1)
    truth = fact_chain_truth()
    head = FactAttention(2, 3, truth.num_symbols, max_question_len=3, embed_dim=16)
    start = head.evaluate(test)["accuracy"]
    metrics = fit_svi(head, train, collapsed=True, progress=False, seed=0)
    assert metrics["loss"].iloc[-1] < 0.5 * metrics["loss"].iloc[0]
    assert head.evaluate(train)["accuracy"] >= 0.97 * truth.evaluate(train)["accuracy"]
    assert head.evaluate(test)["accuracy"] >= 0.95 * truth.evaluate(test)["accuracy"] > start + 0.3


# -- symbols without a row of their own (embedded_symbols) ------------------------------------------------------
def test_symbols_without_a_row_read_zero_and_the_queries_equal_the_oracles():
    """A head whose odd symbols own no row equals the oracle fed ``E`` with those rows at 0 (likelihood, marginals,
    predictions, gradients); their rows start at 0 and get no gradient, under a draw of ``E`` too."""
    owns = torch.arange(S) % 2 == 0
    head = random_embedded_head(2, seed=7)
    masked = FactAttention(2, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=D,
                           embedded_symbols=owns.tolist())
    assert float(masked.symbol_embedding.detach()[~owns].abs().max()) == 0
    assert masked.embedded_symbols.dtype == torch.bool
    masked.load_state_dict({**head.state_dict(), "embedded_symbols": owns})  # random values in every row
    assert float(masked.embeddings().mean[~owns].abs().max()) == 0 and masked.embeddings().mean[owns].abs().min() > 0
    obs = factories.random_fact_observations(3, N, F, M, S, seed=31)
    zeroed = random_embedded_head(2, seed=7)
    with torch.no_grad():
        zeroed.symbol_embedding[~owns] = 0
    leaves, tables = oracle_parameters(zeroed)
    paths, predictive = oracle.path_tables(zeroed, obs, tables)
    expected = oracle.log_likelihood(paths)
    assert torch.allclose(masked.log_likelihood(obs), expected.detach(), atol=1e-9, rtol=0)
    assert torch.allclose(masked.predict_proba(obs), torch.stack(predictive).detach(), atol=1e-9, rtol=0)
    summary = oracle.summaries([{k: (a.detach(), b.detach()) for k, (a, b) in t.items()} for t in paths], N, 2)
    assert torch.allclose(masked.hop_marginals(obs), summary["hop_marginals"], atol=1e-9, rtol=0)
    expected.sum().backward()
    masked.log_likelihood(obs).sum().backward()
    gradient = masked.symbol_embedding.grad
    assert torch.allclose(gradient[owns], leaves["symbol_embedding"].grad[owns], atol=1e-9, rtol=0)
    assert float(gradient[~owns].abs().max()) == 0 and float(gradient[owns].abs().max()) > 0
    with masked.fixed_embedding(torch.randn(S, D, dtype=torch.float64)) as draw:
        assert torch.equal(masked.embedding_matrix(), draw * owns[:, None])


def test_symbols_without_a_row_share_one_normaliser():
    """The emission's normalisers (symbol_embedding.FieldNormalisers) of a head whose odd symbols own no row: those
    symbols all read ``e = 0``, so each field computes one normaliser for all of them, and every normaliser equals
    the one computed without the sharing on ``E`` with their rows at 0."""
    from pyro_multihop.models.symbol_embedding import FieldNormalisers

    owns = torch.arange(S) % 2 == 0
    head = random_embedded_head(2, seed=9)
    obs = factories.random_fact_observations(6, N, F, M, S, seed=4)
    embedding = head.symbol_embedding.detach() * owns[:, None]
    tensors = (embedding, head.emission_bilinear.detach(), head.output_embedding.detach(), head.answer_bias.detach())
    shared, plain = FieldNormalisers(*tensors, embedded_symbols=owns), FieldNormalisers(*tensors)
    assert torch.allclose(shared(obs.facts), plain(obs.facts), atol=1e-12, rtol=0)
    owned = sum(len(torch.unique(obs.facts[..., a][owns[obs.facts[..., a]]])) for a in range(F))
    assert shared.count <= owned + F < plain.count


def test_frequent_symbols_counts_the_rows_that_hold_a_symbol():
    """Against a count by Python sets over the real fields, real question tokens and the target of each row."""
    from pyro_multihop.models.symbol_embedding import frequent_symbols

    obs = factories.random_fact_observations(40, N, F, M, S + 6, seed=3)
    counts = [0] * (S + 6)
    for row in range(len(obs)):
        held = {int(s) for s in obs.facts[row][obs.real_fields()[row]]}
        held |= {int(s) for s in obs.question[row][obs.real_tokens()[row]]} | {int(obs.target[row])}
        for symbol in held:
            counts[symbol] += 1
    for min_count in (1, 5, 12, 40):
        assert frequent_symbols(obs, S + 6, min_count).tolist() == [count >= min_count for count in counts]
    assert not frequent_symbols(obs, S + 9, 1)[S + 6:].any()
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="min_count"):
            frequent_symbols(obs, S + 6, bad)


def test_embedded_symbols_is_checked_and_old_checkpoints_own_every_row(tmp_path):
    from pyro_multihop.checkpoint import load_checkpoint, save_checkpoint

    with pytest.raises(ValueError, match=r"embedded_symbols must have shape \(S,\) = \(6,\), got \(5,\)"):
        FactAttention(2, F, S, embed_dim=D, embedded_symbols=[True] * 5)
    with pytest.raises(TypeError, match="embedded_symbols must hold booleans, got dtype torch.int64"):
        FactAttention(2, F, S, embed_dim=D, embedded_symbols=[1] * S)
    with pytest.raises(ValueError, match="embedded_symbols needs embed_dim"):
        FactAttention(2, F, S, embedded_symbols=[True] * S)
    head = random_embedded_head(2)
    loaded = load_checkpoint(factories.checkpoint_without(head, ("embedded_symbols",), tmp_path))[0]  # before it
    assert loaded.embedded_symbols.all() and torch.equal(loaded.symbol_embedding, head.symbol_embedding)
    partial = FactAttention(2, F, S, embed_dim=D, embedded_symbols=[True, False] * 3)
    save_checkpoint(tmp_path / "new.pt", partial)
    assert load_checkpoint(tmp_path / "new.pt")[0].embedded_symbols.tolist() == [True, False] * 3
