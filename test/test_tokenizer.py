#!/usr/bin/env python3
"""test/test_tokenizer.py - `wlbtrain convert` against tiktoken and against real token counts.

(a) With tiktoken (in the python test/run.sh runs this with, scripts/test-python.sh; skipped with
    the reason when it is missing, failed with CI set): the ids wlbtrain writes, read back from
    PREFIX.bin/.idx, must equal tiktoken's encode_ordinary plus the EOD (after the BOS 128000 for
    Llama 3, convert's default), for the Llama 3 and the GPT-2 rank files of ../shared/real-data
    (tiktoken.Encoding built from the local file: tiktoken cannot download here), on the C headers
    of libc6-dev (the demo corpus) and on a generated corpus of many scripts, numbers, whitespace
    runs, CRLF, contractions, emoji, long words and random mixtures.
    Text with invalid UTF-8 (which tiktoken cannot take) must decode back to its exact bytes.
(b) Without tiktoken either: the 1,000 OpenWebText documents of the BigScience Megatron fixture are
    decoded to text (GPT-2 byte-level vocabulary beside it), converted with both rank files, and the
    per-document token counts must equal lengths/openwebtext1000_lengths.csv (llama3_tokens and
    gpt2_tokens count the EOD: they are len(encode_ordinary(text)) + 1; converted with --bos none).

Environment: WLBTRAIN (default ./wlbtrain), WLB_REAL_DATA (default ../shared/real-data).
Output: TAP ("1..N", "ok N - name", "not ok N - name", "ok N # SKIP reason").
"""
import base64
import csv
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

WLBTRAIN = os.environ.get("WLBTRAIN") or "./wlbtrain"
REAL = os.environ.get("WLB_REAL_DATA") or "../shared/real-data"
LLAMA3_RANKS = os.path.join(REAL, "tokenizers/llama3_tokenizer.model")
GPT2_RANKS = os.path.join(REAL, "tokenizers/gpt2_r50k_base.tiktoken")
OWT = os.path.join(REAL, "megatron_fixtures/bigscience_owt1000/meg-gpt2-openwebtext_text_document")
OWT_VOCAB = os.path.join(REAL, "megatron_fixtures/bigscience_owt1000/gpt2-tiny-vocab.json")
OWT_CSV = os.path.join(REAL, "lengths/openwebtext1000_lengths.csv")

# tiktoken's patterns (tiktoken_ext/openai_public.py r50k_base; Meta's llama3 tokenizer.py).
PAT_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PAT_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
EOD = {"llama3": 128001, "gpt2": 50256}
BOS = {"llama3": [128000], "gpt2": []}  # convert's default: Llama 3's <|begin_of_text|> first, none for GPT-2


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, import_module, missing  # noqa: E402


def need(*paths):
    for p in paths:
        if not os.path.exists(p):
            raise missing("real data absent: %s (it lives in ../shared/real-data beside the clone)" % p)


def tiktoken():
    """The tiktoken module; Skip (Missing with CI set) when this python has none."""
    tk = import_module("tiktoken")
    if isinstance(tk, Exception):
        raise tk
    return tk


_encodings = {}


def encoding(name):
    """tiktoken.Encoding for 'llama3' or 'gpt2' from the local rank file."""
    if name not in _encodings:
        path = LLAMA3_RANKS if name == "llama3" else GPT2_RANKS
        need(path)
        tk = tiktoken()
        from tiktoken.load import load_tiktoken_bpe
        _encodings[name] = tk.Encoding("wlb-test-" + name, pat_str=PAT_LLAMA3 if name == "llama3" else PAT_GPT2,
                                       mergeable_ranks=load_tiktoken_bpe(path), special_tokens={})
    return _encodings[name]


def rank_bytes(path):
    """The bytes of every rank, straight from the tiktoken file (stdlib only)."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                assert int(rank) == len(out)
                out.append(base64.b64decode(tok))
    return out


def read_set(prefix):
    """Documents of a Megatron data set (one sequence each) as lists of ints."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        binary = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad magic"
    version, = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    code = idx[17]
    size, fmt = {8: (2, "H"), 4: (4, "i")}[code]
    n_seq, n_doc = struct.unpack_from("<QQ", idx, 18)
    lengths = struct.unpack_from("<%di" % n_seq, idx, 34)
    pointers = struct.unpack_from("<%dq" % n_seq, idx, 34 + 4 * n_seq)
    doc_index = struct.unpack_from("<%dq" % n_doc, idx, 34 + 12 * n_seq)
    assert list(doc_index) == list(range(n_seq + 1)), "one sequence per document expected"
    return [list(struct.unpack_from("<%d%s" % (n, fmt), binary, p)) for n, p in zip(lengths, pointers)], code


def convert(tmp, name, args):
    """Runs wlbtrain convert; returns the documents written."""
    prefix = os.path.join(tmp, name)
    r = subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", prefix] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if r.returncode != 0:
        raise AssertionError("wlbtrain convert %s: exit %d: %s" % (" ".join(args), r.returncode,
                                                                   r.stderr.decode(errors="replace").strip()))
    return read_set(prefix)[0]


def write_files(tmp, sub, docs):
    """Each document (bytes) as a file; returns the path of a list of them for --files-from."""
    d = os.path.join(tmp, sub)
    os.makedirs(d, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        p = os.path.join(d, "%05d.txt" % i)
        with open(p, "wb") as f:
            f.write(doc)
        paths.append(p)
    lst = os.path.join(tmp, sub + ".list")
    with open(lst, "w") as f:
        f.write("".join(p + "\n" for p in paths))
    return lst


def compare(name, docs_text, got):
    enc = encoding(name)
    assert len(got) == len(docs_text), "%d documents written, %d given" % (len(got), len(docs_text))
    bad = []
    for i, (text, ids) in enumerate(zip(docs_text, got)):
        want = BOS[name] + enc.encode_ordinary(text) + [EOD[name]]
        if ids != want:
            k = next((j for j, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
            bad.append("doc %d (%r...): first difference at token %d: got %s, tiktoken %s"
                       % (i, text[:40], k, ids[max(0, k - 2):k + 3], want[max(0, k - 2):k + 3]))
    assert not bad, "%d of %d documents differ from tiktoken:\n  %s" % (len(bad), len(got), "\n  ".join(bad[:5]))


def libc_headers():
    try:
        out = subprocess.run(["dpkg", "-L", "libc6-dev"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        raise missing("dpkg -L libc6-dev does not work here (the libc6-dev headers are a test corpus)")
    paths = sorted(p for p in out.splitlines() if p.startswith("/") and p.endswith(".h") and os.path.isfile(p))
    if not paths:
        raise missing("libc6-dev lists no headers")
    return paths


def headers_vs_tiktoken(name):
    def run(tmp):
        enc = encoding(name)  # skips early without tiktoken or the rank file
        paths = libc_headers()
        lst = os.path.join(tmp, "headers.list")
        with open(lst, "w") as f:
            f.write("".join(p + "\n" for p in paths))
        ranks = LLAMA3_RANKS if name == "llama3" else GPT2_RANKS
        got = convert(tmp, "h", ["--tokenizer", ranks, "--files-from", lst])
        texts = []
        for p in paths:
            with open(p, "rb") as f:
                texts.append(f.read().decode("utf-8"))
        compare(name, texts, got)
        assert enc is not None
    return run


SAMPLES = [
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; they'll've gone, we'd known, you're late.",
    "SHOUTING CONTRACTIONS: IT'S, WE'LL, THEY'VE, I'M, YOU'D, DON'T. Mixed: It'S, we'Ll, ʼs, ’s, 'ſ, 'K.",
    "Français : l'été, déjà, où ça ? Ça coûte 12,50 € — « bien sûr ».",
    "Deutsch: Straße, Größe, übermäßig; Ärger Öl Übel. ẞ",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка!",
    "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ١٢٣٤٥٦٧٨٩٠",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "বাংলা: আমি বাংলায় গান গাই। ০১২৩৪৫৬৭৮৯",
    "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "中文：我能吞下玻璃而不伤身体。天地玄黄，宇宙洪荒。１２３４５",
    "日本語：いろはにほへと ちりぬるを カタカナ ﾊﾝｶｸ 漢字。",
    "한국어: 다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은",
    "Tiếng Việt: Tôi có thể ăn thủy tinh mà không hại gì.",
    "ქართული: მინას ვჭამ და არა მტკივა. Հայերեն: Կրնամ ապակի ուտել. አማርኛ: ብርጭቆ መብላት እችላለሁ",
    "தமிழ்: நான் கண்ணாடி சாப்பிடுவேன். ತನ್ನ",
    "Numbers: 1 12 123 1234 12345 123456 1234567 3.14159 2,718,281 1e-10 0x1F ½ ¾ ² ³ Ⅻ ⅷ ٣٤٥ ۴۵۶ １２３ ①②",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 1️⃣ ❤️ 🧑🏿‍🚀 ✈️ ☃ 🏳️‍🌈",
    "Whitespace:  two   three    four\t\ttabs\u00a0nbsp\u2003em\u3000ideographic\u180emongolian\u0085nel"
    "\u2028ls\u2029ps\u200bzwsp\ufeffbom end   ",
    "CRLF line one\r\nline two\r\n\r\n\r\nlone CR\rlone LF\n\n\n  \n\t\n end\r\n",
    "    indented code\n\tif (x) {\n\t\treturn y;\n\t}\n",
    "int main(void) { printf(\"%d\\n\", a[i] >= 0 ? a[i] : -a[i]); return 0; } // done\n/* comment */",
    "https://example.com/path?q=1&r=two#frag user@example.org C:\\Windows\\System32 ../../etc/passwd",
    "Punctuation runs: !!!??? ... --- === +++ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| ~~~ ``` \"\"\"",
    "<|endoftext|> <|end_of_text|> <|begin_of_text|> are plain text to encode_ordinary",
    "a" * 300 + " " + "xyz" * 150 + " " + "0123456789" * 30 + " " + "=" * 400 + " " * 200 + "\n" * 50 + "end",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis "
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
    " leading space", "  two leading", "trailing space ", "\n", " ", "x", "'", "'s", "''''", "1", "１",
]

FRAGMENTS = [
    "the", " cat", "'s", "'S", "'ll", "'LL", "'ve", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "123",
    "4567890", "12", ",", ".", "!?", "==", "->", "{", "}", "(", ")", "\"", "'", "é", "αβ", "при", "日本",
    "हि", "عر", "😀", "👍🏽", "\u00a0", "\u3000", "\u180e", "\u0085", "\u2028", "\u200b", "٣", "１", "Ⅻ", "½",
    "ß", "İ", "ǅ", "ﬁ", "\u0301", "\u05b0", "\ufeff", "\x00", "\x07", "\x1f", "\x7f",
]

# Blocks assigned long before both PCRE2's and Rust's Unicode tables (no version skew).
BLOCKS = [(0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x400, 0x4FF), (0x5D0, 0x5EA),
          (0x621, 0x64A), (0x660, 0x669), (0x905, 0x939), (0x2010, 0x2027), (0x2200, 0x22FF), (0x3041, 0x3096),
          (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x1F600, 0x1F64F)]


def varied_corpus():
    rng = random.Random(20240601)
    docs = list(SAMPLES)
    for _ in range(250):
        docs.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 80))))
    for _ in range(150):
        out = []
        for _ in range(rng.randint(1, 200)):
            r = rng.random()
            if r < 0.15:
                out.append(rng.choice(" \n\t"))
            elif r < 0.2:
                out.append(rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE"]))
            else:
                lo, hi = rng.choice(BLOCKS)
                out.append(chr(rng.randint(lo, hi)))
        docs.append("".join(out))
    return [d for d in docs if d]


def varied_vs_tiktoken(name):
    def run(tmp):
        encoding(name)
        docs = varied_corpus()
        path = os.path.join(tmp, "varied.jsonl")
        with open(path, "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        ranks = LLAMA3_RANKS if name == "llama3" else GPT2_RANKS
        compare(name, docs, convert(tmp, "v", ["--tokenizer", ranks, path]))
    return run


def invalid_utf8_round_trip(name):
    """No tiktoken: the ids of text with invalid UTF-8 must decode to the exact input bytes."""
    def run(tmp):
        ranks = LLAMA3_RANKS if name == "llama3" else GPT2_RANKS
        need(ranks)
        table = rank_bytes(ranks)
        rng = random.Random(7)
        bad = [b"\x80", b"\xbf", b"\xc0", b"\xc1", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98",
               b"\xed\xa0\x80", b"\xc3"]
        docs = []
        for _ in range(200):
            parts = []
            for _ in range(rng.randint(1, 60)):
                parts.append(rng.choice(bad) if rng.random() < 0.25 else rng.choice(FRAGMENTS).encode())
            docs.append(b"".join(parts) or b"\xff")
        for _ in range(50):
            docs.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000))))
        got = convert(tmp, "inv", ["--tokenizer", ranks, "--files-from", write_files(tmp, "inv", docs)])
        assert len(got) == len(docs)
        for i, (doc, ids) in enumerate(zip(docs, got)):
            assert ids[-1] == EOD[name], "doc %d does not end with the EOD" % i
            assert ids[:len(BOS[name])] == BOS[name], "doc %d does not start with the BOS" % i
            ids = ids[len(BOS[name]):]
            assert all(0 <= t < len(table) for t in ids[:-1]), "doc %d: an id outside the ranks" % i
            back = b"".join(table[t] for t in ids[:-1])
            assert back == doc, "doc %d: %r decodes to %r" % (i, doc[:60], back[:60])
    return run


def bytes_to_unicode():
    """GPT-2's byte <-> printable character map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def owt_vs_csv(name):
    def run(tmp):
        ranks = LLAMA3_RANKS if name == "llama3" else GPT2_RANKS
        need(OWT + ".idx", OWT + ".bin", OWT_VOCAB, OWT_CSV, ranks)
        docs, code = read_set(OWT)
        assert code == 8 and len(docs) == 1000
        with open(OWT_VOCAB, encoding="utf-8") as f:
            vocab = {v: k for k, v in json.load(f).items()}
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        texts = []
        for ids in docs:
            assert ids[-1] == 4999, "fixture documents end with EOD 4999"
            texts.append(bytes(byte_of[c] for i in ids[:-1] for c in vocab[i]))
        with open(OWT_CSV) as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 1000 and [int(r["doc"]) for r in rows] == list(range(1000))
        # The fixture's own counts include its EOD: a sanity check of the decoding above.
        assert all(len(d) == int(r["gpt2_tiny_tokens"]) for d, r in zip(docs, rows))
        got = convert(tmp, "owt", ["--tokenizer", ranks, "--bos", "none", "--files-from", write_files(tmp, "owt", texts)])
        col = name + "_tokens"
        bad = [(i, len(g), int(r[col])) for i, (g, r) in enumerate(zip(got, rows)) if len(g) != int(r[col])]
        assert not bad, "%d documents differ from %s (doc, wlbtrain incl. EOD, csv): %s" % (len(bad), col, bad[:10])
        assert all(g[-1] == EOD[name] for g in got)
    return run


TESTS = [
    ("llama3 ids equal tiktoken on the libc6-dev headers", headers_vs_tiktoken("llama3")),
    ("gpt2 ids equal tiktoken on the libc6-dev headers", headers_vs_tiktoken("gpt2")),
    ("llama3 ids equal tiktoken on a varied unicode corpus", varied_vs_tiktoken("llama3")),
    ("gpt2 ids equal tiktoken on a varied unicode corpus", varied_vs_tiktoken("gpt2")),
    ("llama3 ids of invalid UTF-8 decode to the exact bytes", invalid_utf8_round_trip("llama3")),
    ("gpt2 ids of invalid UTF-8 decode to the exact bytes", invalid_utf8_round_trip("gpt2")),
    ("OpenWebText 1000: llama3 counts equal openwebtext1000_lengths.csv", owt_vs_csv("llama3")),
    ("OpenWebText 1000: gpt2 counts equal openwebtext1000_lengths.csv", owt_vs_csv("gpt2")),
]


def main():
    print("1..%d" % len(TESTS))
    failed = 0
    for n, (name, fn) in enumerate(TESTS, 1):
        tmp = tempfile.mkdtemp(prefix="wlbtest-py-")
        try:
            fn(tmp)
            print("ok %d - %s" % (n, name))
        except Skip as e:
            print("ok %d # SKIP %s" % (n, e))
            print("# skip: %s" % e)  # test/run.sh lists these lines once each
        except Exception:
            failed += 1
            print("not ok %d - %s" % (n, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
