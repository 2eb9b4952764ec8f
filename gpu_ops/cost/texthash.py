"""64-bit identity hashes of text columns, computed on Arrow's buffers without a Python
object per value.

A column as distinct as its rows (``pod``) cannot be dictionary-coded cheaply: turning
it into categories costs a hash table of every value, and most of a large read. For
identical-row detection only each value's identity is needed, so such a column is
hashed here in place: every string's UTF-8 bytes, stripped of the whitespace that
``str.strip`` removes (as every other text column is), go through a polynomial over
2**64 and a SplitMix64 finaliser. Values longer than :data:`MAX_FAST_BYTES` (none in a
Kubernetes name, which is at most 253) are hashed by pandas' SipHash instead, where a
polynomial hash could be made to collide on purpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_FAST_BYTES = 256
_MUL = np.uint64(0x100000001B3)  # odd: every byte position counts
# _POW[i] = MUL**(MAX_FAST_BYTES - 1 - i): byte k of a value of length L weighs MUL**(L-1-k).
_POW = np.cumprod(np.concatenate([[np.uint64(1)], np.full(MAX_FAST_BYTES - 1, _MUL, np.uint64)]), dtype=np.uint64)[::-1].copy()
# Exactly the characters str.isspace() accepts (what str.strip removes), for RE2
# (gpu_ops_tests/cost/test_texthash.py checks the list against str.isspace).
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_SPACE_CLASS = "[" + "".join(f"\\x{{{ord(c):04x}}}" for c in SPACES) + "]"
_STRIP = f"^{_SPACE_CLASS}+|{_SPACE_CLASS}+$"
# First bytes that can begin a whitespace character (ASCII ones, and the lead bytes of
# U+0085/U+00A0, U+1680, U+2000-U+205F, U+3000); a last byte >= 0x80 ends a non-ASCII one.
_LEAD = np.zeros(256, bool)
_LEAD[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0xC2, 0xE1, 0xE2, 0xE3]] = True
_TAIL = np.zeros(256, bool)
_TAIL[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
_TAIL[0x80:] = True


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit moves every output bit."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


EMPTY_TEXT_HASH = splitmix64(np.zeros(1, np.uint64))[0]  # "" (and a missing value): no bytes, length 0


def text_hashes(array: Any) -> np.ndarray:
    """uint64 per value of an Arrow string array (chunked or not, dictionary or plain);
    missing values hash as the empty string, as text columns read them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        parts = [text_hashes(c) for c in array.chunks]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)
    if pa.types.is_dictionary(array.type):
        per_value = text_hashes(array.dictionary)
        codes = np.asarray(array.indices.fill_null(0) if array.null_count else array.indices)
        out = per_value[codes] if len(per_value) else np.zeros(len(array), np.uint64)
        if array.null_count:
            out[array.is_null().to_numpy(zero_copy_only=False)] = EMPTY_TEXT_HASH
        return out
    array = array if pa.types.is_large_string(array.type) else array.cast(pa.large_string())
    if array.null_count:
        array = array.fill_null("")
    if len(array) and _may_have_edge_space(array):
        array = pc.replace_substring_regex(array, _STRIP, "")
    return _hash_plain(array)


def _offsets_and_data(array: Any) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.frombuffer(array.buffers()[1], np.int64)[array.offset : array.offset + len(array) + 1]
    data = array.buffers()[2]
    return offsets, np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)


def _may_have_edge_space(array: Any) -> bool:
    """A cheap look at each value's first and last byte; True sends the column through
    the exact (regular expression) strip."""
    offsets, data = _offsets_and_data(array)
    full = offsets[1:] > offsets[:-1]
    return bool(_LEAD[data[offsets[:-1][full]]].any() or _TAIL[data[offsets[1:][full] - 1]].any())


def _hash_plain(array: Any) -> np.ndarray:
    """A large_string array with no nulls -> hashes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(array):
        return np.empty(0, np.uint64)
    offsets, data = _offsets_and_data(array)
    lengths = np.diff(offsets)
    long = lengths > MAX_FAST_BYTES
    if long.any():
        import pandas as pd

        out = _hash_plain(pc.if_else(pa.array(long), "", array))
        out[long] = splitmix64(pd.util.hash_array(np.asarray(array.filter(pa.array(long)).to_pylist(), dtype=object)))
        return out
    data = data[offsets[0] : offsets[-1]]
    begin = offsets[:-1] - offsets[0]
    pos = np.arange(len(data), dtype=np.int64) - np.repeat(begin + lengths - MAX_FAST_BYTES, lengths)
    with np.errstate(over="ignore"):
        # A zero after the data lets an empty last value index it; empty values sum to 0.
        terms = np.append(data.astype(np.uint64) * _POW[pos], np.uint64(0))
        sums = np.add.reduceat(terms, np.minimum(begin, len(data)))
    sums[lengths == 0] = 0
    return splitmix64(sums ^ (lengths.astype(np.uint64) << np.uint64(56)))
