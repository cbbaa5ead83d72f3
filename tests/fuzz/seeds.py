#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers (tests/fuzz/corpus/).

pool_bytes: each seed re-seals (flags bit 0) one record of the harness's image after
setting 8 bytes at one offset to all ones. Record numbers are those that
`CXLRT_FUZZ_LIST_RECORDS=1 pool_bytes_fuzz` prints for the harness's image:
pool header 0, host 0's owner/control/bakery lines 1-3, directory entry 0
(13), allocator header 269, segment entries 270-271, a segment header 272
and its bitmap 273, arena 0 and its ring rows 313-315, the KV header 325,
namespace 0 (326), partition 0's header and counters 330-331, its pins 332,
entries 333-336. A seed that hits another record after a layout change is
still a valid input. Plus the unpatched image.

comm_bytes: for each target (header, join line, post, p2p line) and call,
the lines a correct peer writes (no patch), and one field set to all ones;
and the inputs that found defects (named found-*).
"""
import pathlib
import struct

RECORDS = [0, 1, 2, 3, 13, 269, 270, 271, 272, 273, 313, 314, 315, 325, 326, 330, 331, 332,
           333, 334, 335, 336]
OFFSETS = [8, 24, 40]



def corpus(name):
    out = pathlib.Path(__file__).parent / "corpus" / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    return out


out = corpus("pool_bytes")
(out / "image").write_bytes(b"\x00")
for rec in RECORDS:
    for off in OFFSETS:
        seed = b"\x01" + struct.pack("<HHB", rec, off, 8) + b"\xff" * 8
        (out / f"r{rec}-o{off}").write_bytes(seed)

out = corpus("comm_bytes")
for target in range(4):
    calls = range(5) if target == 2 else [0]
    for call in calls:
        for large in (0, 0x80):
            head = bytes([target, call | large, 1])
            (out / f"t{target}-c{call}-l{large}").write_bytes(head)
            for off in OFFSETS:
                (out / f"t{target}-c{call}-l{large}-o{off}").write_bytes(
                    head + bytes([off, 8]) + b"\xff" * 8)
# A ReduceScatter post whose out-of-line data sits at an odd pool offset:
# the reader reduced misaligned floats (UBSan), until CheckPost refused it.
(out / "found-misaligned-post-data").write_bytes(bytes([2, 0x83, 1, 0x28, 0xFF, 0xFF, 0xEF]))
# A post whose element type is 255: the mismatch message indexed past the
# type names.
(out / "found-type-255").write_bytes(bytes([2, 0, 0, 17, 1, 0xFF]))
