"""Example counts of the property-based (hypothesis) tests, chosen by marker: a few hundred cases
in the default run (well under a minute on 2 cores), >= 1,000 per input kind under `-m slow`.

| input | default run | `-m slow` |
|---|---|---|
| specs (tests/test_fuzz_spec.py: values, keys, syntax) | 3 x 30 = 90 | 3 x 400 = 1,200 |
| tuning CSVs (tests/test_fuzz_tuning_csv.py: cells, bytes) | 2 x 150 = 300 | 2 x 600 = 1,200 |
| compile reports (tests/test_fuzz_data_files.py: reader, through the CLI) | 40 + 15 = 55 | 400 (reader) |
| upstream tuning logs (tests/test_fuzz_data_files.py: `tune import`) | 40 | 400 |
| records: bundle and backup manifests, reach and kernel-cache records (tests/test_fuzz_records.py) | 4 x 60 = 240 | 4 x 1,000 = 4,000 |
| what travels: bundle zip members, a planted backup folder, a reach record in a prefix (tests/test_fuzz_travel.py) | 3 x 40 = 120 | 3 x 1,000 = 3,000 |
| kernel-cache folders: entries, links, modes (tests/test_compile_cache_trust.py) | 30 | 1,000 |
| a card report's allow-list: planted secrets, any text (tests/test_report.py) | 3 x 150 + 300 = 750 | 3 x 3,000 + 5,000 = 14,000 |
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

_BASE = settings(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])


def fast(n: int) -> settings:
    """Default run: derandomized (the same cases every run, no flakes); no shrinking, so a
    failure prints its input at once."""
    return settings(_BASE, max_examples=n, derandomize=True)


def slow(n: int) -> settings:
    """`-m slow`: fresh random cases every run."""
    return settings(_BASE, max_examples=n)


def node_paths(node, loc=()):
    """Every location in a parsed document (YAML or JSON), as a tuple of keys and indexes: the
    places the mutation fuzzers pick from."""
    yield loc
    if isinstance(node, dict):
        for k, v in node.items():
            yield from node_paths(v, loc + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from node_paths(v, loc + (i,))


# byte-level changes of a file: (how, where as a fraction of its length, a byte), applied by `damaged`
byte_edits = st.lists(st.tuples(st.sampled_from(["flip", "insert", "cut"]), st.floats(0, 1), st.integers(0, 255)),
                      min_size=1, max_size=6)


def damaged(raw: bytes, edits) -> bytes:
    """`raw` with `edits` (byte_edits) applied: bytes flipped, inserted or cut anywhere."""
    out = bytearray(raw)
    for how, where, byte in edits:
        i = min(int(where * len(out)), max(len(out) - 1, 0))
        if how == "flip" and out:
            out[i] ^= byte or 1
        elif how == "insert":
            out.insert(i, byte)
        else:
            del out[i:]
    return bytes(out)
