"""Property-based tests of the strict readers: valid files, mutated every way of ``tests/mutations.py``, through
the Python API and the command; each outcome is a named one-line error or an exact round trip."""

import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mutations
from pyro_multihop import ChainedAttention, Observations
from pyro_multihop.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from pyro_multihop.cli import main
from pyro_multihop.data import DataError
from pyro_multihop.datasets.babi import BabiFormatError, read_babi

SYMBOLS = 16


def checked(examples: int):
    """Reproducible (derandomized) and small: the whole file stays well under a minute on two busy cores.
    ``PYRO_MULTIHOP_MUTATIONS=k`` multiplies the examples by ``k`` (a longer soak run, outside the suite)."""
    return settings(max_examples=examples * int(os.environ.get("PYRO_MULTIHOP_MUTATIONS", "1")), deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def observations(draw):
    n, N = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    symbols = st.lists(st.integers(0, SYMBOLS - 1), min_size=n * N, max_size=n * N)
    keys, values = (torch.tensor(draw(symbols)).reshape(n, N) for _ in range(2))
    query, target = (torch.tensor(draw(symbols)[:n]) for _ in range(2))
    mask = None
    if draw(st.booleans()):
        mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n * N, max_size=n * N))).reshape(n, N)
        mask[:, draw(st.integers(0, N - 1))] = True
    return Observations(keys, values, query, target, mask)


def picker(data):
    return lambda n: data.draw(st.integers(0, n - 1)) if n > 1 else 0


def expect_outcome(case, load, exact, error_type, place: str):
    """Load the mutated file: an exact round trip when the case expects one, else one named error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning or pandas ParserWarning on the way
        try:
            result = load()
        except error_type as error:
            message = str(error)
            assert case.expect is not None, f"{case.kind}: a harmless variant refused: {message}"
            assert place in message and "\n" not in message, (case.kind, message)
            for fragment in case.expect:
                assert fragment in message, (case.kind, fragment, message)
            return message
    assert case.expect is None or case.or_exact, f"{case.kind}: accepted silently"
    assert exact(result), f"{case.kind}: loaded, but not as written"
    return None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("head") / "head.pt"
    save_checkpoint(path, ChainedAttention(2, SYMBOLS, SYMBOLS, sigma2=0.1, seed=0), step=5,
                    vocabulary=[f"s{i}" for i in range(SYMBOLS)])
    return path


def run_command(capsys, argv) -> tuple:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def expect_command(case, capsys, argv):
    """The command on the mutated file: exit 0 when the file is fine, else status 2 and one line naming it."""
    code, lines = run_command(capsys, argv)
    if case.expect is None or (case.or_exact and code == 0):
        assert code == 0, (case.kind, lines)
        return
    assert code == 2 and len(lines) == 1 and "Traceback" not in lines[0], (case.kind, code, lines)
    for fragment in case.expect:
        assert fragment in lines[0], (case.kind, fragment, lines[0])


@pytest.mark.parametrize("kind", mutations.CSV_KINDS, ids=lambda kind: kind.__name__)
@checked(8)
@given(obs=observations(), data=st.data())
def test_csv_mutations_are_named_or_read_exactly(tmp_path_factory, capsys, checkpoint, obs, data, kind):
    pick = picker(data)
    case = kind(obs, pick)
    path = tmp_path_factory.getbasetemp() / "mutated.csv"
    path.write_bytes(case.content)
    message = expect_outcome(case, lambda: Observations.load(path), obs.__eq__, DataError, f"data file {str(path)!r}")
    # Under a 2-way sharded read the same error comes from the rank holding the bad row, with the file's row
    # and line; the other rank's rows are read exactly.
    if message is not None:
        messages = []
        for rank in range(2):
            try:
                Observations.load(path, shard=(rank, 2))
            except DataError as error:
                messages.append(str(error))
        assert messages and set(messages) == {message}, (case.kind, messages, message)
    if data.draw(st.integers(0, 3), label="command") == 0:
        expect_command(case, capsys, ["evaluate", "--checkpoint", str(checkpoint), "--data", str(path)])


def test_a_csv_cut_inside_its_last_number_is_undetectable_as_documented(tmp_path):
    """The one cut a CSV reader cannot see: the last number shortened reads as a valid, different number."""
    obs = Observations([[1, 2]], [[3, 45]], [6], [17])
    path = tmp_path / "cut.csv"
    obs.save(path)
    path.write_bytes(path.read_bytes()[:-2])  # "...,45\n" -> "...,4"
    assert Observations.load(path).values.tolist() == [[3, 4]]


@pytest.mark.parametrize("kind", mutations.PARQUET_KINDS, ids=lambda kind: kind.__name__)
@checked(12)
@given(obs=observations(), data=st.data())
def test_parquet_mutations_are_named_or_read_exactly(tmp_path_factory, capsys, checkpoint, obs, data, kind):
    pytest.importorskip("pyarrow")
    pick = picker(data)
    case = kind(obs, pick)
    path = tmp_path_factory.getbasetemp() / "mutated.parquet"
    path.write_bytes(case.content)
    expect_outcome(case, lambda: Observations.load(path), obs.__eq__, DataError, f"data file {str(path)!r}")
    if data.draw(st.integers(0, 3), label="command") == 0:
        expect_command(case, capsys, ["evaluate", "--checkpoint", str(checkpoint), "--data", str(path)])


@pytest.mark.parametrize("kind", mutations.CHECKPOINT_KINDS, ids=lambda kind: kind.__name__)
@checked(20)
@given(data=st.data())
def test_checkpoint_mutations_are_named_or_read_exactly(tmp_path_factory, capsys, checkpoint, data, kind):
    payload = read_checkpoint(checkpoint)
    original, _ = load_checkpoint(checkpoint)
    case = kind(payload, picker(data))
    path = tmp_path_factory.getbasetemp() / "mutated.pt"
    path.write_bytes(case.content)

    def exact(loaded):
        model, state = loaded
        return state["step"] == 5 and all(torch.equal(model.state_dict()[k], v) for k, v in original.state_dict().items())

    expect_outcome(case, lambda: load_checkpoint(path), exact, CheckpointError, str(path))
    if data.draw(st.integers(0, 3), label="command") == 0:
        data_path = tmp_path_factory.getbasetemp() / "valid.csv"
        Observations([[1, 2]], [[3, 4]], [1], [4]).save(data_path)
        expect_command(case, capsys, ["evaluate", "--checkpoint", str(path), "--data", str(data_path)])


WORDS = st.text(alphabet="abcdefghij", min_size=1, max_size=5)


@st.composite
def babi_stories(draw):
    """Stories of made-up words: statements, and questions whose supporting IDs name earlier statements."""
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        statements, line_id = [], 0
        for _ in range(draw(st.integers(1, 6))):
            line_id += 1
            if statements and draw(st.booleans()):
                support = " ".join(str(s) for s in draw(st.lists(st.sampled_from(statements), min_size=1, max_size=2)))
                words = " ".join(draw(st.lists(WORDS, min_size=1, max_size=4)))
                lines.append(f"{line_id} {words}? \t{draw(WORDS)}\t{support}\n")
            else:
                statements.append(line_id)
                lines.append(f"{line_id} {' '.join(draw(st.lists(WORDS, min_size=1, max_size=5)))}.\n")
        line_id += 1
        lines.append(f"{line_id} {draw(WORDS)}? \t{draw(WORDS)}\t{statements[-1]}\n")
    return "".join(lines)


@pytest.mark.parametrize("kind", mutations.BABI_KINDS, ids=lambda kind: kind.__name__)
@checked(10)
@given(story=babi_stories(), data=st.data())
def test_babi_mutations_are_named_or_read_exactly(tmp_path_factory, story, data, kind):
    folder = tmp_path_factory.getbasetemp()
    (folder / "valid.txt").write_text(story)

    def parsed(questions):
        return [(q.statements, q.question, q.answer, q.supporting, q.source.rsplit(":", 1)[1]) for q in questions]

    expected = parsed(read_babi(folder / "valid.txt"))
    case = kind(story, picker(data))
    path = folder / "mutated.txt"
    path.write_bytes(case.content)
    expect_outcome(case, lambda: read_babi(path), lambda result: parsed(result) == expected, BabiFormatError,
                   f"{path}:")


def test_every_error_class_is_a_value_error():
    for error in (DataError, CheckpointError, BabiFormatError):
        assert issubclass(error, ValueError)
