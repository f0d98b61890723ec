#!/usr/bin/env python3
"""bench/make_corpus.py - a Megatron data set (PREFIX.idx + PREFIX.bin, MMIDIDX v1, one sequence per
document) of random tokens, for benchmarks on machines without the real data: document lengths are
drawn from a length list (json list, or one number per line; lengths above --max-len are cut to
it), in order and repeating, or uniformly from 1..--max-len without one. Tokens are uniform below
--vocab (int32 when --vocab > 65535, else uint16).

  bench/make_corpus.py --out /tmp/docs --docs 20000 --vocab 128256 --lengths lengths.json --max-len 32768
"""
import argparse
import array
import json
import random
import struct
import sys

try:
    import numpy as np
except ImportError:  # the same format without numpy (other random tokens): machines without it
    np = None


def read_lengths(path):
    with open(path) as f:
        text = f.read()
    try:
        return [int(x) for x in json.loads(text)]
    except ValueError:
        return [int(line.split(",")[-1]) for line in text.split() if line.strip().isdigit() or "," in line]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--lengths")
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if np is None:
        return main_plain(a)
    rng = np.random.default_rng(a.seed)
    if a.lengths:
        src = [max(1, min(x, a.max_len)) for x in read_lengths(a.lengths) if x > 0]
        lengths = np.array([src[i % len(src)] for i in range(a.docs)], dtype=np.int64)
    else:
        lengths = rng.integers(1, a.max_len + 1, size=a.docs)
    dtype, code = (np.int32, 4) if a.vocab > 65535 else (np.uint16, 8)
    with open(a.out + ".bin", "wb") as f:
        for n in lengths:
            f.write(rng.integers(0, a.vocab, size=int(n)).astype(dtype).tobytes())
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * item
    with open(a.out + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, a.docs, a.docs + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(a.docs + 1, dtype="<i8").tobytes())
    print("make_corpus: %d documents, %d tokens (lengths %d..%d), vocabulary %d -> %s.idx/.bin"
          % (a.docs, int(lengths.sum()), int(lengths.min()), int(lengths.max()), a.vocab, a.out))
    return 0


def main_plain(a):
    rng = random.Random(a.seed)
    if a.lengths:
        src = [max(1, min(x, a.max_len)) for x in read_lengths(a.lengths) if x > 0]
        lengths = [src[i % len(src)] for i in range(a.docs)]
    else:
        lengths = [rng.randint(1, a.max_len) for _ in range(a.docs)]
    typecode, item, code = ("i", 4, 4) if a.vocab > 65535 else ("H", 2, 8)
    with open(a.out + ".bin", "wb") as f:
        for n in lengths:
            f.write(array.array(typecode, (rng.randrange(a.vocab) for _ in range(n))).tobytes())
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at * item)
        at += n
    with open(a.out + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, a.docs, a.docs + 1))
        f.write(struct.pack("<%di" % a.docs, *lengths))
        f.write(struct.pack("<%dq" % a.docs, *pointers))
        f.write(struct.pack("<%dq" % (a.docs + 1), *range(a.docs + 1)))
    print("make_corpus: %d documents, %d tokens (lengths %d..%d), vocabulary %d -> %s.idx/.bin"
          % (a.docs, sum(lengths), min(lengths), max(lengths), a.vocab, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
