"""Brute-force oracle of the structured-facts head: every score from its formula, one fact pair at a time, and
every hop path enumerated (``N^L`` of them), with plain torch scalar ops so that autograd gives the gradients.

Independent of the head's vectorised code: no padded tables, no flat indices, no scatter; ranks, ages and the
nearest facts sharing a field are found by Python loops over the real facts.
"""

import itertools
import math

import torch

UNIT = 10.0  # DISTANCE_UNIT


def real_field_symbols(obs, row, i):
    """``{a: symbol}`` of the real fields of fact ``i``."""
    real = obs.real_fields()
    return {a: int(obs.facts[row, i, a]) for a in range(obs.num_fields) if bool(real[row, i, a])}


def nearest_fact(obs, row, real, i, a, direction):
    """The nearest real fact before (``direction = 0``) or after (1) fact ``i`` whose field ``a`` equals ``i``'s."""
    mine = real_field_symbols(obs, row, i)
    if a not in mine:
        return None
    order = [j for j in real if (j < i if direction == 0 else j > i)]
    for j in (reversed(order) if direction == 0 else order):
        if real_field_symbols(obs, row, j).get(a) == mine[a]:
            return j
    return None


def score(p, obs, row, hop, previous, j, D):
    """The gate logit of candidate ``j`` at 0-based ``hop`` after fact ``previous`` (None at hop 0)."""
    real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
    tokens = [m for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])]
    last = p["question_position"].shape[1] - 1  # positions past the head's P share the last one's logit
    choice = torch.stack([p["question_choice"][hop, int(obs.question[row, m])] + p["question_position"][hop, min(m, last)]
                          for m in tokens])
    weights = torch.softmax(choice, 0)
    fj = real_field_symbols(obs, row, j)
    total = 0.0
    rank = {i: r for r, i in enumerate(real)}
    for w, m in zip(weights, tokens):
        q = int(obs.question[row, m])
        for b, symbol in fj.items():
            total = total + w * (p["question_equality"][hop, b] * float(q == symbol) + p["question_tables"][hop, b, q, symbol])
        if q in fj.values():  # recency among the facts that name q: how many later real facts name it too
            later = sum(q in real_field_symbols(obs, row, k).values() for k in real if rank[k] > rank[j])
            total = total + w * p["mention_slopes"][hop].clamp(max=0) * min(later, D)  # held at or below 0
    if "last_fact_kind" in p and hop == p["age_slopes"].shape[0] - 1:  # the last hop's candidate's frame symbols
        total = total + sum(p["last_fact_kind"][s] * float(p["frame_symbols"][s]) for s in fj.values())
    # the question pattern: every ordered pair of (token, field) matches, positions past P in the P-th's bin
    pairs = [(min(m, last), b) for m in tokens for b, symbol in fj.items() if int(obs.question[row, m]) == symbol]
    for m, b in pairs:
        for m2, b2 in pairs:
            total = total + p["question_pattern"][hop, m, b, m2, b2]
    age = min(len(real) - 1 - rank[j], D) / UNIT
    if previous is None:
        return total + p["age_slopes"][0] * age
    k = hop - 1
    fi = real_field_symbols(obs, row, previous)
    frame = p["frame_symbols"].tolist()
    for a, sa in fi.items():
        for b, sb in fj.items():
            total = total + p["field_equality"][k, a, b] * float(sa == sb) + p["content_tables"][k, a, b, sa, sb]
            if "frame_content" in p:  # two distinct frame symbols: the table of every field pair (a table head)
                total = total + p["frame_content"][k, sa, sb] * float(sa != sb and frame[sa] and frame[sb])
    age_slope = p["age_slopes"][hop] + sum(p["age_by_symbol"][k, a, s] for a, s in fi.items())
    offset_slope = p["offset_slopes"][k] + sum(p["offset_by_symbol"][k, a, s] for a, s in fi.items())
    forward = p["direction_logits"][k] + sum(p["direction_by_symbol"][k, a, s] for a, s in fi.items())
    total = total + age_slope * age + offset_slope * min(abs(rank[j] - rank[previous]), D) / UNIT
    total = total + forward * float(rank[j] > rank[previous])
    # the neighbours: the real fact right before / right after the previous one
    total = total + p["adjacent_logits"][k, 0] * float(rank[j] == rank[previous] - 1)
    total = total + p["adjacent_logits"][k, 1] * float(rank[j] == rank[previous] + 1)
    for direction in range(2):
        depends = sum(p["nearest_by_symbol"][k, direction, a, s] for a, s in fi.items())
        for a in range(obs.num_fields):
            if nearest_fact(obs, row, real, previous, a, direction) == j:
                total = total + p["nearest_weights"][k, direction, a] + depends
    return total


def gate(p, obs, row, hop, previous, D):
    """``{j: log p(z = j | previous)}`` over the real facts."""
    real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
    if previous is not None and not p["revisit"] and len(real) > 1:  # no hop attends the previous hop's fact again
        real = [j for j in real if j != previous]
    scores = torch.stack([torch.as_tensor(score(p, obs, row, hop, previous, j, D), dtype=torch.float64) for j in real])
    return dict(zip(real, torch.log_softmax(scores, 0)))


def comparison(p, obs, row, i):
    """``(weight, (S,) p_compare(. | fact i))`` of the emission's comparison component from its definition: the
    emission's own softmax over the real question tokens, the matches of the chosen token with each real field."""
    fi = real_field_symbols(obs, row, i)
    tokens = [m for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])]
    last = p["compare_position"].shape[0] - 1
    question = [int(obs.question[row, m]) for m in tokens]
    weights = torch.softmax(torch.stack([p["compare_choice"][q] + p["compare_position"][min(m, last)]
                                         for m, q in zip(tokens, question)]), 0)
    logits = p["compare_bias"]
    flip = sum(p["compare_flip"][symbol] for symbol in fi.values())  # the fact's symbols turn what a match says
    for b, symbol in fi.items():
        match = sum(w * float(q == symbol) for w, q in zip(weights, question))
        logits = logits + match * (p["compare_logits"][b] + flip * p["compare_flip_logits"][b])
    gate = torch.exp(sum(p["compare_by_symbol"][symbol] for symbol in fi.values()))
    return gate, _on_symbols(torch.softmax(logits, 0), p)


def _on_symbols(probs, p):
    """``(S,)``: a distribution over the head's answers (``p["answer_symbols"]``, where the head has them) placed on
    those symbols, zero on every other."""
    answers = p.get("answer_symbols")
    if answers is None:
        return probs
    return torch.zeros(len(p["copy_by_symbol"]), dtype=probs.dtype).index_put((answers,), probs)


def copy_logit(p, obs, row, a, symbol):
    """The log weight of copying ``symbol`` from field ``a``, from its definition: its symbol's weight, whether the
    question names it, and the mean over the real question tokens of their weight for field ``a``."""
    question = [int(obs.question[row, m]) for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])]
    asked = sum(p["copy_by_question"][q, a] for q in question) / len(question)
    return p["copy_by_symbol"][symbol] + p["copy_question_equality"][a] * float(symbol in question) + asked


def register(p, obs, row):
    """``(S,)`` ``p_register(target)`` of the held-set register from its definition: for each real question token
    ``m`` (its softmax weight), every symbol's chance of being held by a loop over its occurrences in story order,
    then every subset of the symbols that can be held enumerated, for the count and for the sets an answer says."""
    config = p["register"]
    R, F, S = config["counts"], obs.num_fields, len(p["copy_by_symbol"])
    tokens = [m for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])]
    last = p["register_position"].shape[0] - 1
    weights = torch.softmax(torch.stack([p["register_position"][min(m, last)] for m in tokens]), 0)
    mu = torch.sigmoid(p["set_logits"]) * torch.tensor([0.0] + [1.0] * (R - 1), dtype=torch.float64)
    out = torch.zeros(S, dtype=torch.float64)
    for weight, m in zip(weights, tokens):
        person_symbol = int(obs.question[row, m])
        held, first = {}, {}  # symbol: P(held), its first occurrence that can change it
        for i in range(obs.num_facts):
            if not bool(obs.full_mask()[row, i]):
                continue
            fi = real_field_symbols(obs, row, i)
            person = [f for f, symbol in fi.items() if symbol == person_symbol]
            for g in sorted(fi):
                if not person or g in person:
                    continue
                o = fi[g]
                logits = (sum(p["register_by_fact_symbol"][symbol] for symbol in fi.values())
                          + p["register_by_object"][o] + sum(p["register_by_field_pair"][f, g] for f in person))
                set_, _, keep = torch.softmax(logits, 0)
                held[o] = set_ + keep * held.get(o, 0.0)
                first.setdefault(o, (i, g))
        symbols = sorted(held)
        counts, sets = [0.0] * R, {}
        for bits in itertools.product([0, 1], repeat=len(symbols)):
            prob = torch.tensor(1.0, dtype=torch.float64)
            for symbol, bit in zip(symbols, bits):
                prob = prob * (held[symbol] if bit else 1 - held[symbol])
            chosen = tuple(sorted((s for s, bit in zip(symbols, bits) if bit), key=first.get))
            counts[min(len(chosen), R - 1)] = counts[min(len(chosen), R - 1)] + prob
            sets[chosen] = prob
        sayable = torch.zeros(S, dtype=torch.float64)
        for symbol in symbols:
            sayable = sayable + sets[(symbol,)] * torch.eye(S, dtype=torch.float64)[symbol]
        for answer, parts in config["lists"]:
            if tuple(parts) in sets:
                sayable = sayable + sets[tuple(parts)] * torch.eye(S, dtype=torch.float64)[answer]
        said = sum(counts[r] * (1 - mu[r]) * _on_symbols(torch.softmax(p["count_logits"][r], 0), p)
                   for r in range(R))
        if symbols:
            said = said + sum(counts[r] * mu[r] for r in range(R)) * sayable / sayable.sum()
        out = out + weight * said
    return out


def composition(p, obs, row):
    """``(S,)`` ``p_composition(target)`` of the composition of two facts from its definition: a loop over every
    ordered pair of distinct real facts (the fact with itself in a row of one), every question token and field."""
    real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
    tokens = [(m, int(obs.question[row, m])) for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])]
    last = p["max_question_len"] - 1

    def side_of(m):  # +1 at the first question position, -1 at the P-th and past it
        return 1.0 if last == 0 else 1.0 - 2.0 * min(m, last) / last

    def stated(i):
        return sum(p["composition_relation"][symbol] for symbol in real_field_symbols(obs, row, i).values())

    asked = sum(p["composition_question"][q] for _, q in tokens)

    def role(i, j):
        other = set(real_field_symbols(obs, row, j).values())
        score = 0.0
        for m, q in tokens:
            for b, symbol in real_field_symbols(obs, row, i).items():
                if symbol == q and q not in other:
                    score = score + p["composition_gate"][q] * side_of(m) * p["composition_side"][b]
        return torch.tanh(3.0 * torch.as_tensor(score, dtype=torch.float64))

    pairs = [(i, j) for i in real for j in real if i != j] or [(i, i) for i in real]
    probs = 0.0
    for i, j in pairs:
        a = role(i, j) * torch.dot(stated(i), asked) + role(j, i) * torch.dot(stated(j), asked)
        probs = probs + torch.softmax(p["composition_bias"] + p["composition_out"] * a, 0) / len(pairs)
    return _on_symbols(probs, p)


def emission(p, obs, row, i, register_probs=None, composition_probs=None):
    """``(S,)`` ``log p(target | fact i)`` from the mixture's definition (``register_probs``, ``composition_probs``:
    the row's :func:`register` and :func:`composition`, computed here where the head has one and it is not given)."""
    fi = real_field_symbols(obs, row, i)
    F = obs.num_fields
    mix = torch.softmax(p["emission_mix"], 0)
    S = len(p["copy_by_symbol"])
    probs = 0.0
    copies = {a: mix[F + a] * torch.exp(copy_logit(p, obs, row, a, symbol)) for a, symbol in fi.items()}
    for a, symbol in fi.items():
        table = _on_symbols(torch.softmax(p["emission_tables"][a, symbol], 0), p)
        probs = probs + mix[a] * table + copies[a] * torch.eye(S, dtype=torch.float64)[symbol]
    norm = sum(mix[a] + copies[a] for a in fi)
    gate, compared = comparison(p, obs, row, i)
    probs = probs + mix[2 * F] * gate * compared
    norm = norm + mix[2 * F] * gate
    # floored at the smallest normal number as the head floors it (a symbol no component emits; finite gradients)
    probs = (probs / norm).clamp_min(torch.finfo(torch.float64).tiny)
    if p.get("register") is not None:
        rho = torch.sigmoid(p["register_mix"][0])
        probs = (1 - rho) * probs + rho * (register(p, obs, row) if register_probs is None else register_probs)
    if p.get("composition") is not None:
        kappa = torch.sigmoid(p["composition_mix"][0])
        probs = (1 - kappa) * probs + kappa * (composition(p, obs, row) if composition_probs is None
                                               else composition_probs)
    return torch.log(probs)


def path_tables(head, obs, params=None):
    """Per row ``{path: (log prior, log joint)}`` over every path of real facts, and per row the ``(S,)``
    predictive; ``params`` (default: the head's parameters in float64) may require grad."""
    p = params if params is not None else {k: v.detach().double() for k, v in head.named_parameters()}
    p = {**p, "answer_symbols": getattr(head, "answer_symbols", None), "revisit": head.revisit,
         "frame_symbols": getattr(head, "frame_symbols", torch.zeros(head.num_symbols, dtype=torch.bool)),
         "register": head.register_config() if getattr(head, "uses_register", False) else None,
         "composition": getattr(head, "composition_dim", None), "max_question_len": head.max_question_len}
    D = head.max_distance
    tables, predictive = [], []
    for row in range(len(obs)):
        real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
        gates = {(0, None): gate(p, obs, row, 0, None, D)}
        for hop in range(1, head.n_hops):
            for i in real:
                gates[(hop, i)] = gate(p, obs, row, hop, i, D)
        register_probs = register(p, obs, row) if p["register"] is not None else None
        composition_probs = composition(p, obs, row) if p["composition"] is not None else None
        emissions = {i: emission(p, obs, row, i, register_probs, composition_probs) for i in real}
        table, mixture = {}, 0.0
        for path in itertools.product(real, repeat=head.n_hops):
            if any(path[hop] not in gates[(hop, path[hop - 1])] for hop in range(1, head.n_hops)):
                continue  # a revisit the head forbids: probability zero
            prior = gates[(0, None)][path[0]]
            for hop in range(1, head.n_hops):
                prior = prior + gates[(hop, path[hop - 1])][path[hop]]
            table[path] = (prior, prior + emissions[path[-1]][int(obs.target[row])])
            mixture = mixture + prior.exp() * emissions[path[-1]].exp()
        tables.append(table)
        predictive.append(mixture)
    return tables, predictive


def log_likelihood(tables):
    """``(n,)`` differentiable log-likelihoods."""
    return torch.stack([torch.logsumexp(torch.stack([joint for _, joint in t.values()]), 0) for t in tables])


def summaries(tables, N, L):
    """Hop marginals ``(L, n, N)``, pairwise ``(L - 1, n, N, N)``, MAP paths given the target and of the prior
    ``(n, L)``, and per row the log-joint table ``path -> float`` (for entropy, k-best, sampling)."""
    n = len(tables)
    marginals = torch.zeros(L, n, N, dtype=torch.float64)
    pairwise = torch.zeros(max(L - 1, 0), n, N, N, dtype=torch.float64)
    map_given, map_prior, log_joints = [], [], []
    for row, table in enumerate(tables):
        joints = {path: float(joint) for path, (_, joint) in table.items()}
        total = math.log(math.fsum(math.exp(v) for v in joints.values()))
        for path, value in joints.items():
            weight = math.exp(value - total)
            for hop, position in enumerate(path):
                marginals[hop, row, position] += weight
            for hop in range(L - 1):
                pairwise[hop, row, path[hop], path[hop + 1]] += weight
        map_given.append(max(sorted(joints), key=lambda path: joints[path]))
        map_prior.append(max(sorted(table), key=lambda path: float(table[path][0])))
        log_joints.append(joints)
    return {
        "hop_marginals": marginals,
        "pairwise_marginals": pairwise,
        "map_given": torch.tensor(map_given),
        "map_prior": torch.tensor(map_prior),
        "log_joints": log_joints,
        "log_priors": [{path: float(prior) for path, (prior, _) in table.items()} for table in tables],
    }


def assert_likelihood_exact(head, obs, expected, atol=1e-9):
    """The head's log-likelihood equals ``expected`` ``(n,)``, in one chunk and in chunks of one row."""
    assert torch.allclose(head.log_likelihood(obs), expected, atol=atol, rtol=0)
    assert torch.allclose(head.log_likelihood(obs, budget=1), expected, atol=atol, rtol=0)  # one row a chunk


def pyro_model_losses(head, obs, expected, atol=1e-9):
    """``(enumerated, collapsed)``: the losses of the head's enumerated model (``TraceEnum_ELBO``) and collapsed
    model (``Trace_ELBO``) with its guide, each asserted equal to ``expected`` (the exact negative log-likelihood)."""
    import pyro
    from pyro.infer import Trace_ELBO, TraceEnum_ELBO

    with pyro.get_param_store().scope():
        enumerated = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)
        collapsed = Trace_ELBO().differentiable_loss(head.collapsed_model, head.guide, obs)
    assert torch.allclose(enumerated, expected, atol=atol, rtol=0)
    assert torch.allclose(collapsed, expected, atol=atol, rtol=0)
    return enumerated, collapsed


def assert_gradients_exact(head, obs, names):
    """The gradients of the head's log-likelihood for the parameters ``names`` equal the oracle's (each non-zero);
    then both Pyro models' losses equal the exact negative log-likelihood (:func:`pyro_model_losses`)."""
    params = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    tables, _ = path_tables(head, obs, params)
    log_likelihood(tables).sum().backward()
    head.log_likelihood(obs).sum().backward()
    for name in names:
        got, want = getattr(head, name).grad, params[name].grad
        assert torch.allclose(got, want, atol=1e-9, rtol=0), name
        assert got.abs().sum() > 0, name
    return pyro_model_losses(head, obs, -head.log_likelihood(obs).sum())


def assert_marginals_and_map_exact(head, obs, expected, atol=1e-9):
    """Hop and pairwise marginals (one row a chunk) and the MAP paths given the target and of the prior equal
    :func:`summaries`' ``expected``."""
    posterior = head.posterior(obs, pairwise=True, budget=1)
    assert torch.allclose(posterior.hop_marginals, expected["hop_marginals"], atol=atol, rtol=0)
    assert torch.allclose(head.pairwise_marginals(obs), expected["pairwise_marginals"], atol=atol, rtol=0)
    assert torch.equal(head.map_paths(obs), expected["map_given"])
    assert torch.equal(head.map_paths(obs, given_target=False), expected["map_prior"])
