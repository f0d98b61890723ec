"""bench/attn_mix.py - one window of documents drawn from a length list, for the attention benchmarks
(bench/attention_kernels.sh, scripts/device/profile_attention.sh): lengths drawn at random (seeded)
from the list's positive lengths, packed from row 0 until the window is full, the last one cut at
the window's end. Prints one segment a line, "q_row q_len kv_row kv_len" (each document alone: the
format bench/attn_kernels.c and bench/attn_torch.py read).

Usage: python3 bench/attn_mix.py LENGTHS_JSON WINDOW SEED
"""
import json
import random
import sys


def main():
    lens = [x for x in json.load(open(sys.argv[1])) if x > 0]
    w, rng, row = int(sys.argv[2]), random.Random(int(sys.argv[3])), 0
    while row < w:
        n = min(rng.choice(lens), w - row)
        print(row, n, row, n)
        row += n


if __name__ == "__main__":
    main()
