"""Brute-force oracle for the tests: enumerate every hop path of every observation, in float64 Python loops.

Independent of the library's gate code: it uses full squared distances between explicit query, key and
value vectors, so one oracle serves the one-hot chained head (vectors = one-hot rows, key tables) and the
tied-embedding head (vectors = embeddings). :func:`brute_force` and :func:`head_path_tables` read those vectors
off a head; :func:`exact_path_posterior` and the ``assert_*`` functions compare the engine's path queries with the
enumeration; :func:`enumerated_loss` is the second reference, Pyro's own enumeration. The random heads and
observations the tests feed them are tests/factories.py.
"""

import itertools
import math

import pytest
import torch


def enumerate_paths(
    query_vectors, key_vectors, value_vectors, sigma2, emission, values, target, mask=None, position_logit=None,
    log=False,
):
    """Joint probabilities of every hop path (with ``log``, their logarithms, summed rather than multiplied: exact
    where a joint's product would underflow float64).

    :param query_vectors: ``(n, D)`` hop-1 query vector of each observation.
    :param key_vectors: list over hops of ``(n, N, D)`` key vectors of each position.
    :param value_vectors: ``(n, N, D)`` the query a position passes to the next hop.
    :param emission: ``(S, T)``; :param values: ``(n, N)``; :param target: ``(n,)``.
    :param position_logit: optional ``(allowed, hop, previous, position) -> float`` added to the gate logit
        (``allowed``: the real positions of the row in order; ``previous``: None at hop 0), see
        :func:`position_logit`.
    :returns: list over observations of dicts ``path tuple -> (prior p(path), joint p(path, target))`` (their logs
        with ``log``).
    """
    n, N = values.shape
    hops = len(key_vectors)
    result = []
    for row in range(n):
        allowed = [i for i in range(N) if mask is None or bool(mask[row, i])]
        row_term = position_logit(row) if getattr(position_logit, "per_row", False) else position_logit

        def gate(query, hop, previous):
            scores = [
                -float(((query - key_vectors[hop][row, i]) ** 2).sum()) / (2 * sigma2)
                + (0.0 if position_logit is None else float(row_term(allowed, hop, previous, i)))
                for i in allowed
            ]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            if log:
                return {i: s - top - math.log(total) for i, s in zip(allowed, scores)}
            return {i: w / total for i, w in zip(allowed, weights)}

        table = {}
        for path in itertools.product(allowed, repeat=hops):
            prior = 0.0 if log else 1.0
            query = query_vectors[row]
            previous = None
            for hop, position in enumerate(path):
                if log:
                    prior += gate(query, hop, previous)[position]
                else:
                    prior *= gate(query, hop, previous)[position]
                query = value_vectors[row, position]
                previous = position
            emitted = float(emission[values[row, path[-1]], target[row]])
            if log:
                table[path] = (prior, prior + (math.log(emitted) if emitted > 0 else -math.inf))
            else:
                table[path] = (prior, prior * emitted)
        result.append(table)
    return result


def onehot_vectors(key_tables, obs):
    """Query, per-hop key and value vectors of the one-hot chained head."""
    key_tables = key_tables.detach().double()
    eye = torch.eye(key_tables.shape[-1], dtype=torch.float64)
    return eye[obs.query], [table[obs.keys] for table in key_tables], eye[obs.values]


def embedding_vectors(embeddings, obs, n_hops):
    """Query, per-hop key and value vectors of the tied head at ``embeddings`` ``(S, D)`` (may require grad)."""
    return embeddings[obs.query], [embeddings[obs.keys]] * n_hops, embeddings[obs.values]


def plug_in_embeddings(head):
    """Vectors whose squared distances are a tied head's plug-in table: the means, and for ``plug_in="expected"``
    one more dimension per symbol holding ``sqrt(sum_d scale_sd^2)`` (so that ``s != t`` adds both variances)."""
    loc, scale = head.embeddings()
    if head.plug_in == "mean":
        return loc
    return torch.cat([loc, torch.diag(scale.pow(2).sum(-1).sqrt())], -1)


def head_position_logit(head, obs):
    """The position term (:func:`position_logit`) of a ``ChainedAttention(max_distance=...)``; None for a head
    whose gate sees symbols only."""
    if getattr(head, "max_distance", None) is None:
        return None
    return position_logit(head.age_slopes.detach(), head.offset_slopes.detach(), head.max_distance,
                          head.direction_logits.detach(), obs.values)


def head_path_tables(head, obs, embeddings=None, log=False):
    """:func:`enumerate_paths` of a head on ``obs``: a chained head's one-hot vectors and key tables (with its
    position term, if any), or a tied head's :func:`plug_in_embeddings` (or ``embeddings`` ``(S, D)``)."""
    if hasattr(head, "key_tables"):
        vectors = onehot_vectors(head.key_tables, obs)
    else:
        embeddings = plug_in_embeddings(head) if embeddings is None else embeddings
        vectors = embedding_vectors(embeddings.double(), obs, head.n_hops)
    return enumerate_paths(*vectors, head.sigma2, head.emission.detach().double(), obs.values, obs.target, obs.mask,
                           position_logit=head_position_logit(head, obs), log=log)


def brute_force(head, obs, embeddings=None):
    """:func:`summarise` of :func:`head_path_tables`: every query of a head on ``obs``, by enumeration."""
    tables = head_path_tables(head, obs, embeddings)
    return summarise(tables, obs.context_len, emission=head.emission.detach().double(), values=obs.values)


def summarise(tables, N, num_targets=None, emission=None, values=None):
    """Log-likelihoods, hop marginals ``(L, n, N)``, pairwise ``(L-1, n, N, N)``, MAP paths, predictive, and
    ``joints``: per observation, ``path -> p(path, target)``."""
    n = len(tables)
    hops = len(next(iter(tables[0])))
    log_likelihood = torch.zeros(n, dtype=torch.float64)
    marginals = torch.zeros(hops, n, N, dtype=torch.float64)
    pairwise = torch.zeros(max(hops - 1, 0), n, N, N, dtype=torch.float64)
    map_paths = torch.zeros(n, hops, dtype=torch.long)
    predictive = None if emission is None else torch.zeros(n, emission.shape[1], dtype=torch.float64)
    for row, table in enumerate(tables):
        total = sum(joint for _, joint in table.values())
        log_likelihood[row] = math.log(total)
        best = max(table.items(), key=lambda item: item[1][1])[0]
        map_paths[row] = torch.tensor(best)
        for path, (prior, joint) in table.items():
            for hop, position in enumerate(path):
                marginals[hop, row, position] += joint / total
            for hop in range(hops - 1):
                pairwise[hop, row, path[hop], path[hop + 1]] += joint / total
            if predictive is not None:
                predictive[row] += prior * emission[values[row, path[-1]]].double()
    return {
        "log_likelihood": log_likelihood,
        "hop_marginals": marginals,
        "pairwise_marginals": pairwise,
        "map_paths": map_paths,
        "predictive": predictive,
        "joints": [{path: joint for path, (_, joint) in table.items()} for table in tables],
    }



def log_likelihood_autograd(
    query_vectors, key_vectors, value_vectors, sigma2, emission, values, target, position_logit=None
):
    """Differentiable brute force: ``(n,)`` log-likelihoods, every path summed with plain torch ops.

    Arguments as :func:`enumerate_paths` (no mask); ``key_vectors``, ``emission`` and the tables behind
    ``position_logit`` may require grad.
    """
    n, N = values.shape
    results = []
    for row in range(n):
        total = 0.0
        allowed = list(range(N))
        for path in itertools.product(range(N), repeat=len(key_vectors)):
            prob = 1.0
            query = query_vectors[row]
            previous = None
            for hop, position in enumerate(path):
                distances = ((query - key_vectors[hop][row]) ** 2).sum(-1)
                logits = -distances / (2 * sigma2)
                if position_logit is not None:
                    term = position_logit(row) if getattr(position_logit, "per_row", False) else position_logit
                    logits = logits + torch.stack([term(allowed, hop, previous, i) for i in allowed])
                prob = prob * torch.softmax(logits, dim=0)[position]
                query = value_vectors[row, position]
                previous = position
            total = total + prob * emission[values[row, path[-1]], target[row]]
        results.append(torch.log(total))
    return torch.stack(results)


# -- the posterior over hop paths: exact distribution, entropy, sorted paths, goodness of fit -----------------
# A "log-joint table" is a dict ``path tuple -> log p(path, target)`` (``-inf``, or a padding score near
# -1e30 and below, for paths of probability zero) of one observation.

ZERO_PROBABILITY_SCORE = -5e29


def chain_log_joints(init, trans, log_emission, row):
    """Log-joint table of observation ``row`` of a hop chain, every one of the ``N^L`` paths, from its factors.

    :param init: ``(n, N)``; :param trans: ``(L - 1, n, N, N)``; :param log_emission: ``(n, N)``.
    """
    N = init.shape[-1]
    hops = 1 + trans.shape[0]
    table = {}
    for path in itertools.product(range(N), repeat=hops):
        terms = [float(init[row, path[0]]), float(log_emission[row, path[-1]])]
        terms += [float(trans[hop, row, path[hop], path[hop + 1]]) for hop in range(hops - 1)]
        table[path] = sum(terms)
    return table


def log_joints_of(table):
    """Log-joint table of one observation's :func:`enumerate_paths` table (paths through padding are absent)."""
    return {path: (math.log(joint) if joint > 0 else -math.inf) for path, (_, joint) in table.items()}


def path_posterior(log_joints):
    """``path -> p(path | target)``; zero-probability paths get exactly 0."""
    live = {path: value for path, value in log_joints.items() if value > ZERO_PROBABILITY_SCORE}
    top = max(live.values())
    weights = {path: math.exp(value - top) for path, value in live.items()}
    total = math.fsum(weights.values())
    return {path: weights.get(path, 0.0) / total for path in log_joints}


def path_entropy(log_joints):
    """Entropy in nats of the posterior over paths, ``-sum p log p``."""
    return -math.fsum(p * math.log(p) for p in path_posterior(log_joints).values() if p > 0)


def sorted_paths(log_joints):
    """``[(path, log p(path | target)), ...]`` over the paths of nonzero probability, most probable first."""
    posterior = path_posterior(log_joints)
    live = [(path, math.log(p)) for path, p in posterior.items() if p > 0]
    return sorted(live, key=lambda item: -item[1])


def chi_square_test(counts, probabilities, min_expected=5.0):
    """Pearson chi-square goodness of fit of drawn counts against exact cell probabilities, pooled over rows.

    :param counts: list over observations of dicts ``cell -> number of draws``.
    :param probabilities: list over observations of dicts ``cell -> exact probability`` (each sums to 1).
    :returns: ``(statistic, degrees of freedom, p-value)``. Within a row, cells expected fewer than
        ``min_expected`` times are pooled into one; a draw in a cell of probability 0 gives p-value 0.
    The p-value is the chi-square survival function ``Q(dof / 2, statistic / 2)`` (regularised upper
    incomplete gamma function, ``torch.special.gammaincc``).
    """
    statistic, dof = 0.0, 0
    for row_counts, row_probs in zip(counts, probabilities):
        draws = sum(row_counts.values())
        if any(row_counts.get(cell, 0) > 0 for cell, p in row_probs.items() if p == 0):
            return math.inf, 0, 0.0
        if set(row_counts) - set(row_probs):
            return math.inf, 0, 0.0
        cells = sorted((p * draws, row_counts.get(cell, 0)) for cell, p in row_probs.items() if p > 0)
        # Pool the rarest cells (ascending) until the pool is expected at least min_expected times.
        pooled_expected, pooled_observed, index = 0.0, 0, 0
        while index < len(cells) and (cells[index][0] < min_expected or 0 < pooled_expected < min_expected):
            pooled_expected += cells[index][0]
            pooled_observed += cells[index][1]
            index += 1
        pooled = cells[index:] + ([(pooled_expected, pooled_observed)] if pooled_expected > 0 else [])
        statistic += sum((observed - expected) ** 2 / expected for expected, observed in pooled)
        dof += len(pooled) - 1
    if dof == 0:
        return statistic, 0, 1.0
    half = torch.tensor([dof / 2, statistic / 2], dtype=torch.float64)
    p_value = float(torch.special.gammaincc(half[0], half[1]))
    return statistic, dof, p_value


def path_counts(paths):
    """``paths (num_samples, n, L)`` -> list over observations of dicts ``path tuple -> count``."""
    counts = []
    for row in range(paths.shape[1]):
        row_counts = {}
        for path in map(tuple, paths[:, row].tolist()):
            row_counts[path] = row_counts.get(path, 0) + 1
        counts.append(row_counts)
    return counts


def position_logit(age_slopes, offset_slopes, max_distance, direction_logits=None, values=None):
    """The age/offset/direction gate term of ``ChainedAttention(max_distance=D)``, from its definition, one
    position at a time: age = real positions after ``position``; offset = real positions from ``previous`` to
    ``position``; direction: ``direction_logits[hop - 1, value at previous]`` if ``position`` lies after it.
    ``values``: ``(n, N)``; the callable then takes the row first: ``term(row)(allowed, hop, previous, i)``."""

    def for_row(row):
        def term(allowed, hop, previous, position):
            logit = base(allowed, hop, previous, position)
            if previous is not None and allowed.index(position) > allowed.index(previous):
                logit = logit + direction_logits[hop - 1, values[row, previous]]
            return logit

        return term

    def base(allowed, hop, previous, position):
        rank = allowed.index(position)
        age = min(len(allowed) - 1 - rank, max_distance)
        logit = age_slopes[hop] * age / 10.0  # slopes are per 10 positions (DISTANCE_UNIT)
        if previous is not None:
            distance = min(abs(rank - allowed.index(previous)), max_distance)
            logit = logit + offset_slopes[hop - 1] * distance / 10.0
        return logit

    for_row.per_row = True
    return base if direction_logits is None else for_row


def exact_path_posterior(head, obs):
    """Per row: ``path -> p(path | observation)`` by brute force, from the joints' logarithms (a joint whose
    product underflows float64 still has its posterior probability)."""
    posteriors = []
    for table in head_path_tables(head, obs, log=True):
        log_joints = {path: log_joint for path, (_, log_joint) in table.items()}
        top = max(log_joints.values())
        total = top + math.log(sum(math.exp(value - top) for value in log_joints.values()))
        posteriors.append({path: math.exp(value - total) for path, value in log_joints.items()})
    return posteriors


def path_entropies(posteriors):
    """``(n,)`` entropies in nats of :func:`exact_path_posterior`'s rows."""
    return torch.tensor([-sum(p * math.log(p) for p in post.values() if p > 0) for post in posteriors],
                        dtype=torch.float64)


def assert_k_best_match(paths, log_probs, posteriors, k, rtol):
    """The k best ``paths (n, k, L)`` and ``log_probs (n, k)`` against the brute-force ``posteriors``
    (:func:`exact_path_posterior`); paths whose probability underflows float64 there (sigma2 = 1e-3) must have
    log-probabilities below its range (or -inf) here."""
    for row, post in enumerate(posteriors):
        best = sorted((p for p in post.values() if p > 0), reverse=True)[:k]
        got = log_probs[row, : len(best)]
        assert torch.allclose(got.exp(), torch.tensor(best, dtype=torch.float64), rtol=rtol)
        assert (log_probs[row, len(best):].exp() == 0).all()
        finite = log_probs[row][torch.isfinite(log_probs[row])]
        assert (finite.diff() <= 0).all()  # best first
        for path, log_prob in zip(paths[row, : len(best)].tolist(), got.tolist()):
            assert post[tuple(path)] == pytest.approx(math.exp(log_prob), rel=rtol)


def assert_map_paths_are_most_probable(paths, posteriors, rtol):
    """Each row's ``paths (n, L)`` has the largest probability of its brute-force posterior."""
    for row, post in enumerate(posteriors):
        assert post[tuple(paths[row].tolist())] == pytest.approx(max(post.values()), rel=rtol)


# -- the second reference: Pyro's own enumeration of the hop latents ----------------------------------------
def enumerated_loss(model, guide, obs, **kwargs):
    """``TraceEnum_ELBO``'s differentiable loss of ``model`` and ``guide`` on ``obs``, in a scope of its own (the
    global param store untouched)."""
    import pyro
    from pyro.infer import TraceEnum_ELBO

    with pyro.get_param_store().scope():
        return TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model, guide, obs, **kwargs)
