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
