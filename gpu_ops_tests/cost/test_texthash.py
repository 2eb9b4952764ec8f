"""Identity hashes of text computed on Arrow buffers agree with Python's own notion of
"the same text after strip()", whatever the layout of the array."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from gpu_ops.cost.texthash import EMPTY_TEXT_HASH, MAX_FAST_BYTES, text_hashes
from gpu_ops.cost.texthash import SPACES as STRIPPED

SPACES = [c for c in map(chr, range(0x110000)) if c.isspace()]


def test_the_stripped_characters_are_exactly_str_isspace() -> None:
    assert list(STRIPPED) == SPACES


def _values(seed: int, n: int = 3000) -> list[str | None]:
    rng = random.Random(seed)
    alphabet = "abc-01é\u00e9\u4e2d" + "".join(SPACES[:3])
    out: list[str | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.03:
            out.append(None)
            continue
        core = "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 2, 5, 12, MAX_FAST_BYTES, MAX_FAST_BYTES + 1])))
        pad = lambda: "".join(rng.choice(SPACES) for _ in range(rng.choice([0, 0, 0, 1, 2])))  # noqa: E731
        out.append(pad() + core + pad())
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_equal_hashes_exactly_for_equal_stripped_text(seed: int) -> None:
    values = _values(seed)
    h = text_hashes(pa.array(values, pa.string()))
    stripped = ["" if v is None else v.strip() for v in values]
    by_text: dict[str, int] = {}
    for text, hv in zip(stripped, h.tolist()):
        assert by_text.setdefault(text, hv) == hv, repr(text)  # same text, same hash
    assert len(set(by_text.values())) == len(by_text)  # different text, different hash


def test_layout_does_not_change_a_hash() -> None:
    values = _values(4, 500)
    whole = text_hashes(pa.array(values, pa.string()))
    assert (text_hashes(pa.array(values, pa.large_string())) == whole).all()
    assert (text_hashes(pa.array(values).dictionary_encode()) == whole).all()
    assert (text_hashes(pa.chunked_array([pa.array(values[:123]), pa.array(values[123:])])) == whole).all()
    assert (text_hashes(pa.array(values).slice(77, 200)) == whole[77:277]).all()
    one_by_one = np.array([text_hashes(pa.array([v], pa.string()))[0] for v in values], np.uint64)
    assert (one_by_one == whole).all()


def test_position_and_length_matter() -> None:
    h = text_hashes(pa.array(["ab", "ba", "a", "a\x00", "\x00a", "", "aa", "a" * 300, "a" * 301]))
    assert len(set(h.tolist())) == len(h)
    assert h[5] == EMPTY_TEXT_HASH == text_hashes(pa.array([None, " "], pa.string()))[0] == text_hashes(pa.array([" "]).dictionary_encode())[0]
