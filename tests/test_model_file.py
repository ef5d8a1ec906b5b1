"""What a model file and the exported hash tables carry: every zip entry checked, and table
state arrays that own their memory."""
import zipfile

import numpy as np
import pytest

from slide.network import Network

from test_network import data, lsh_output, small  # noqa: F401  (data is a fixture)


def test_load_checks_each_entry_past_the_bytes_an_array_needs(data, tmp_path):
    """np.load reads only the bytes an array's header asks for, and the zip format checks an
    entry's CRC-32 at its end: an entry longer than its array must still be checked (a fuzzed
    file with a grown size field and changed array bytes loaded as a different network)."""
    import struct

    train, _ = data
    net = small(epochs=1)
    net.fit(train)
    path, padded = tmp_path / "m.slide", tmp_path / "padded.slide"
    net.save(path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(padded, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename) + b"\0" * 16)
    same = Network.load(padded)                    # trailing bytes with a valid CRC are harmless
    np.testing.assert_array_equal(same.parameters()["layers.0.weight"], net.parameters()["layers.0.weight"])
    with zipfile.ZipFile(padded) as z:
        info = z.getinfo("param/layers.0.weight.npy")
    raw = bytearray(padded.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    data_start = info.header_offset + 30 + name_len + extra_len
    raw[data_start + info.file_size - 16 - 1] ^= 0x40   # the last byte of the array, not of the padding
    padded.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"padded\.slide: .*param/layers\.0\.weight\.npy.*CRC-32"):
        Network.load(padded)


def test_table_state_arrays_outlive_rebuilds_and_the_network(data):
    """table_state hands the engine's exported arrays to numpy without copying them: they must
    own their memory, unchanged by later rebuilds of the tables and by the network's end, and
    restore the very same tables."""
    import gc

    train, _ = data
    net = lsh_output()
    net.fit(train, epochs=1)
    state = net._core.table_state(1)
    kept = {k: np.array(v, copy=True) for k, v in state.items()}
    assert all(np.asarray(state[k]).flags.owndata is False for k in kept if k != "num_rows")
    other = lsh_output(seed=4)
    other.fit(train, epochs=1)
    assert any(not np.array_equal(np.asarray(v), kept[k]) for k, v in other._core.table_state(1).items())
    other._core.set_table_state(1, state)          # the state as handed out restores the tables
    for k, v in other._core.table_state(1).items():
        np.testing.assert_array_equal(np.asarray(v), kept[k], err_msg=k)
    net._core.rebuild_tables()                      # at-once rebuilds free the exported tables' source
    net._core.rebuild_tables()
    del net
    gc.collect()
    for k, v in state.items():
        np.testing.assert_array_equal(np.asarray(v), kept[k], err_msg=k)
    assert int(kept["items"].size) > 0 and int(kept["table_offsets"][-1]) == kept["bucket_ids"].size


def _spread(**kw):
    """lsh_output with each table rebuild spread over 8 batches (the first from step 12 to 19:
    5 batches hash the rows, 3 build the 4 tables)."""
    net = lsh_output(**kw)
    cfg = net.config.to_dict()
    cfg["training"].update(rebuild_first=12, rebuild_spread=8)
    return Network(cfg, lr=0.01)


# The 24 rows are one chunk, hashed by the rebuild's 5th batch (step 16): after step 13 the rebuild
# is planned, after 16 the rows are hashed, after 17 and 18 one and two of the 4 tables are built
# (the C++ tests cover a rebuild cut in the middle of hashing many chunks).
@pytest.mark.parametrize("stop", [13, 16, 17, 18])
def test_a_checkpoint_in_the_middle_of_a_spread_rebuild_resumes_it_exactly(data, tmp_path, stop):
    """Layers of 131,072 neurons or more rebuild their tables over many batches; a checkpoint
    taken meanwhile carries the rebuild in progress (it used to save only the serving tables,
    and the resumed run then differed from the uninterrupted one)."""
    from slide import callbacks

    train, test = data
    full = _spread()
    full.fit(train)
    part = _spread()
    part.fit(train, callbacks=[callbacks.StopAfter(stop)])
    assert part._core.rebuild_pending and part.step == stop
    part.save(tmp_path / "mid.slide")
    with zipfile.ZipFile(tmp_path / "mid.slide") as z:
        assert "tables/1/pending.npy" in z.namelist() and "tables/1/pending_ids.npy" in z.namelist()
    resumed = Network.load(tmp_path / "mid.slide")
    assert resumed._core.rebuild_pending
    state, saved = resumed._core.table_state(1), part._core.table_state(1)
    for name in ("pending", "pending_ids", "items"):
        np.testing.assert_array_equal(state[name], saved[name], err_msg=name)
    resumed.fit(train)
    assert resumed.step == full.step
    for k, v in full.parameters().items():
        np.testing.assert_array_equal(np.asarray(resumed.parameters()[k]), np.asarray(v), err_msg=k)
    for mode in ("exact", "lsh"):
        np.testing.assert_array_equal(full.predict(test[0], mode=mode)[0], resumed.predict(test[0], mode=mode)[0])


def test_a_damaged_rebuild_in_progress_is_refused_by_name(data):
    from slide import callbacks

    train, _ = data
    part = _spread()
    part.fit(train, callbacks=[callbacks.StopAfter(17)])   # rows hashed, one of 4 tables built
    good = part._core.table_state(1)
    other = _spread()
    other.fit(train, callbacks=[callbacks.StopAfter(2)])
    before = other._core.table_state(1)
    cases = [
        (dict(good, pending_ids=good["pending_ids"][:-1]), "pending_ids has"),
        (dict(good, pending_ids=good["pending_ids"].astype(np.int64)), "pending_ids: expected a numpy array of uint32"),
        ({k: v for k, v in good.items() if k != "pending_ids"}, "pending_ids: missing"),
        (dict(good, pending=good["pending"][:4]), "pending: expected 5 entries"),
        (dict(good, pending=np.array([10**6, 32, 0, 8, 2], dtype=np.uint64)), "the rebuild in progress is for 1000000 rows"),
        (dict(good, pending=np.array([good["pending"][0], 32, 0, 8, 8], dtype=np.uint64)), "pending_done=8 must be in 0..7"),
    ]
    for state, msg in cases:
        with pytest.raises(ValueError, match=msg):
            other._core.set_table_state(1, state)
        assert not other._core.rebuild_pending
        np.testing.assert_array_equal(other._core.table_state(1)["items"], before["items"])
