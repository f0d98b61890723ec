#!/usr/bin/env python3
"""test/test_tokenizer_json.py - `wlbtrain convert --tokenizer tokenizer.json` against the
tokenizers library (Hugging Face), and the BOS / EOS rules.

(a) Ids: the ids wlbtrain writes (read back from PREFIX.idx/.bin) must equal the library's
    Tokenizer.encode(text, add_special_tokens=False).ids with encode_special_tokens = True (the
    default --special-tokens ordinary: special-token text is plain text) and with it False
    (--special-tokens match, the library's default), around them the BOS and EOS convert adds:
    - Llama 3's and GPT-2's real tokenizer.json (../shared/real-data/tokenizers; skipped when
      absent) on every second C header of libc6-dev (the demo corpus, 1.1 MB) and a fixed sample of
      the Python standard library's sources (1 MB: every 7th .py file that is UTF-8), in the
      ordinary mode (they have no special-token text), and in both modes on a varied unicode corpus
      (test_tokenizer.py's) and on text full of special-token strings;
    - small byte-level BPEs trained here with the library (needing no real data): GPT-2's layout
      (ByteLevel with its regex, merges as pairs) and Llama 3's (a Split regex, then ByteLevel;
      ignore_merges; a BOS template; merges rewritten as "a b" strings), on the varied corpus.
(b) With a tokenizer.json written here by hand (no library needed): a merge order unlike the order of
    the ids made (the first merge makes the highest id), with and without ignore_merges; BOS first and EOS last by
    default when the tokenizer has them, both switchable off or to another id, one BOS when the text
    already starts with <|begin_of_text|> (in both modes), tokenizer_config.json beside the file.
(c) Malformed tokenizer.json files: one error line "wlbtrain: error: ...", exit status 2, no output.

Environment: WLBTRAIN (default ./wlbtrain), WLB_REAL_DATA (default ../shared/real-data).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, import_module, missing, need_file  # noqa: E402
from test_tokenizer import read_set, libc_headers, varied_corpus, bytes_to_unicode  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN") or "./wlbtrain"
REAL = os.environ.get("WLB_REAL_DATA") or "../shared/real-data"
LLAMA3_JSON = os.path.join(REAL, "tokenizers/llama3_tokenizer.json")
GPT2_JSON = os.path.join(REAL, "tokenizers/gpt2_tokenizer.json")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS_TEXT, EOS_TEXT = "<|begin_of_text|>", "<|end_of_text|>"


def tokenizers():
    tk = import_module("tokenizers")
    if isinstance(tk, Exception):
        raise tk
    return tk


def run_convert(tmp, args, name="o"):
    prefix = os.path.join(tmp, name)
    return subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", prefix] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=600), prefix


def convert(tmp, args):
    r, prefix = run_convert(tmp, args)
    if r.returncode != 0:
        raise AssertionError("wlbtrain convert %s: exit %d: %s" % (" ".join(args), r.returncode,
                                                                   r.stderr.decode(errors="replace").strip()))
    return read_set(prefix)[0]


def jsonl(tmp, name, docs):
    path = os.path.join(tmp, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return path


def stdlib_sample(limit=1_000_000):
    """Python standard library sources: every 7th .py file (sorted) that is UTF-8, up to limit bytes."""
    roots = sorted(d for d in (os.path.join("/usr/lib", n) for n in os.listdir("/usr/lib"))
                   if os.path.basename(d).startswith("python3.") and os.path.isdir(d))
    if not roots:
        raise missing("no /usr/lib/python3.* (the Python standard library is a test corpus)")
    paths = []
    for dirpath, dirnames, filenames in os.walk(roots[-1]):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    docs, total = [], 0
    for p in paths[::7]:
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text and total + len(text) <= limit:
            docs.append(text)
            total += len(text)
    return docs


def specials_corpus(names):
    """Text with special-token strings in it: alone, glued to words, repeated, broken, at both ends."""
    rng = random.Random(38)
    words = ["Hello", " world", "\n", " ", "<|", "|>", "<", "'s", "123", "é", "\r\n", "x"]
    docs = [BOS_TEXT + "Hello", BOS_TEXT + BOS_TEXT + "twice", "no special", EOS_TEXT, "a" + EOS_TEXT + "b",
            "<|begin_of_text", "<|begin_of_text|", " " + BOS_TEXT, BOS_TEXT]
    for _ in range(60):
        docs.append("".join(rng.choice(names + words) for _ in range(rng.randint(1, 30))))
    return docs


def expected(tok, docs, match, bos, eos):
    """The library's ids, with convert's BOS rule: a text starting with the BOS text gets that as its
    BOS (encoded from after it), else the BOS is put first."""
    tok.encode_special_tokens = not match
    out = []
    for d in docs:
        body = d
        if bos is not None and d.startswith(BOS_TEXT) and bos == tok.token_to_id(BOS_TEXT):
            body = d[len(BOS_TEXT):]
        ids = tok.encode(body, add_special_tokens=False).ids
        out.append(([bos] if bos is not None else []) + ids + ([eos] if eos is not None else []))
    return out


def compare(got, want, docs, what):
    assert len(got) == len(want), "%s: %d documents written, %d expected" % (what, len(got), len(want))
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            k = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            bad.append("doc %d (%r...): first difference at token %d: wlbtrain %s, tokenizers %s"
                       % (i, docs[i][:40], k, g[max(0, k - 2):k + 3], w[max(0, k - 2):k + 3]))
    assert not bad, "%s: %d of %d documents differ:\n  %s" % (what, len(bad), len(got), "\n  ".join(bad[:5]))


_library = {}


def library(path):
    """The library's Tokenizer of a real file, loaded once (Llama 3's takes most of a second)."""
    if path not in _library:
        _library[path] = tokenizers().Tokenizer.from_file(path)
    return _library[path]


def check_corpus(tmp, path, docs, bos, eos, modes=("ordinary", "match"), name="c"):
    tok = library(path) if path in (LLAMA3_JSON, GPT2_JSON) else tokenizers().Tokenizer.from_file(path)
    src = jsonl(tmp, name, docs)
    for mode in modes:
        got = convert(tmp, ["--tokenizer", path, "--special-tokens", mode, src])
        compare(got, expected(tok, docs, mode == "match", bos, eos), docs, "%s, %s" % (os.path.basename(path), mode))


def real(path):
    need_file(path)
    tokenizers()
    return path


def llama3_ids(corpus, modes=("ordinary", "match")):
    def run(tmp):
        check_corpus(tmp, real(LLAMA3_JSON), corpus(), 128000, 128001, modes)
    return run


def gpt2_ids(corpus, modes=("ordinary", "match")):
    def run(tmp):
        check_corpus(tmp, real(GPT2_JSON), corpus(), None, 50256, modes)
    return run


def real_summaries(tmp):
    """The summary line of the real files: the vocabulary, BOS and EOD, and the pre-tokenizer regex
    translated from the file equal to the pattern test_tokenizer.py checks against tiktoken (the
    name is printed only when the translation is that pattern, character for character)."""
    src = jsonl(tmp, "s", ["hello"])
    for path, want in [(LLAMA3_JSON, b"vocabulary 128256 (llama3), bos 128000, eod 128001"),
                       (GPT2_JSON, b"vocabulary 50257 (gpt2), bos none, eod 50256")]:
        need_file(path)
        r, _ = run_convert(tmp, ["--tokenizer", path, src])
        assert r.returncode == 0 and want in r.stdout, (path, r.stdout, r.stderr)


def headers():
    """Every second header of libc6-dev (about 1.1 MB)."""
    out = []
    for p in libc_headers()[::2]:
        with open(p, "rb") as f:
            out.append(f.read().decode("utf-8"))
    return out


def llama3_specials():
    tok = library(real(LLAMA3_JSON))
    names = [tok.id_to_token(i) for i in (128000, 128001, 128002, 128006, 128255)]
    return specials_corpus(names + ["<|eot_id|>"])


def gpt2_specials():
    return specials_corpus(["<|endoftext|>", "<|endoftext|", BOS_TEXT])


def train_fixture(tmp, llama_style):
    """A small byte-level BPE trained on the varied corpus and the headers' first lines."""
    tk = tokenizers()
    from tokenizers import models, pre_tokenizers, processors, trainers, Regex
    tok = tk.Tokenizer(models.BPE(ignore_merges=llama_style))
    if llama_style:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = [BOS_TEXT, EOS_TEXT, "<|eot_id|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(varied_corpus() * 3, trainer)
    if llama_style:
        tok.post_processor = processors.TemplateProcessing(single=BOS_TEXT + " $A", pair=BOS_TEXT + " $A $B",
                                                           special_tokens=[(BOS_TEXT, tok.token_to_id(BOS_TEXT))])
    path = os.path.join(tmp, "llama-style.json" if llama_style else "gpt2-style.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    assert isinstance(j["model"]["merges"][0], list), "tokenizers saves merges as pairs"
    if llama_style:  # the other form of the merges
        j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f)
    return path, tok


def fixture_ids(llama_style):
    def run(tmp):
        path, tok = train_fixture(tmp, llama_style)
        docs = varied_corpus() + specials_corpus([BOS_TEXT, EOS_TEXT, "<|eot_id|>", "<|endoftext|>"])
        if llama_style:
            check_corpus(tmp, path, docs, tok.token_to_id(BOS_TEXT), tok.token_to_id(EOS_TEXT))
        else:
            check_corpus(tmp, path, docs, None, tok.token_to_id("<|endoftext|>"))
    return run


# --- (b), (c): a tokenizer.json written by hand -------------------------------------------------

def hand_tokenizer(extra=None, bos=True):
    """256 byte tokens (ids 0..255 in byte order), merges h+e, l+l, he+ll, hell+o; specials
    <|begin_of_text|> 260 and <|end_of_text|> 261; the Llama 3 layout."""
    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    merges = [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"]]
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + i
    j = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": 260, "content": BOS_TEXT, "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False},
                         {"id": 261, "content": EOS_TEXT, "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False}],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": BOS_TEXT, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {BOS_TEXT: {"id": BOS_TEXT, "ids": [260], "tokens": [BOS_TEXT]}}}
        if bos else None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    if extra:
        extra(j)
    return j


def write_json(tmp, name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def bos_eos_rules(tmp):
    tj = write_json(tmp, "tokenizer.json", hand_tokenizer())
    hello = [259]  # "hello" = he + ll + o
    texts = ["hello", BOS_TEXT + "hello", BOS_TEXT + BOS_TEXT + "hello", "hello" + EOS_TEXT, " " + BOS_TEXT]
    src = jsonl(tmp, "b", texts)
    pb, pe = [ord(c) for c in BOS_TEXT], [ord(c) for c in EOS_TEXT]  # as plain text: byte tokens
    cases = [
        ([], [[260] + hello + [261], [260] + hello + [261], [260] + pb + hello + [261],
              [260] + hello + pe + [261], [260, 32] + pb + [261]]),
        (["--special-tokens", "match"], [[260] + hello + [261], [260] + hello + [261], [260, 260] + hello + [261],
                                        [260] + hello + [261, 261], [260, 32, 260, 261]]),
        (["--bos", "none"], [hello + [261], pb + hello + [261], pb + pb + hello + [261], hello + pe + [261],
                             [32] + pb + [261]]),
        (["--bos", "none", "--eod", "none", "--special-tokens", "match"],
         [hello, [260] + hello, [260, 260] + hello, hello + [261], [32, 260]]),
        (["--bos", "7", "--eod", "8"], [[7] + hello + [8], [7] + pb + hello + [8], [7] + pb + pb + hello + [8],
                                        [7] + hello + pe + [8], [7, 32] + pb + [8]]),
    ]
    for args, want in cases:
        got = convert(tmp, ["--tokenizer", tj] + args + [src])
        assert got == want, "convert %s:\n  got  %s\n  want %s" % (" ".join(args), got, want)
    # The summary line says which BOS and EOD it used.
    r, _ = run_convert(tmp, ["--tokenizer", tj, src])
    assert r.returncode == 0 and b"bos 260, eod 261" in r.stdout, r.stdout
    # No template: no BOS by default; tokenizer_config.json beside the file decides then.
    d = os.path.join(tmp, "cfg")
    os.makedirs(d)
    tj2 = write_json(d, "tokenizer.json", hand_tokenizer(bos=False))
    assert convert(tmp, ["--tokenizer", tj2, src])[0] == hello + [261]
    write_json(d, "tokenizer_config.json", {"add_bos_token": True, "bos_token": {"content": EOS_TEXT},
                                            "eos_token": "hello"})
    assert convert(tmp, ["--tokenizer", tj2, src])[0] == [261] + hello + [259]
    write_json(d, "tokenizer_config.json", {"bos_token": BOS_TEXT, "eos_token": None})
    assert convert(tmp, ["--tokenizer", tj2, src])[0] == hello + [261]
    d2 = os.path.join(tmp, "cfg2")  # a template's BOS, turned off by add_bos_token: false
    os.makedirs(d2)
    write_json(d2, "tokenizer_config.json", {"add_bos_token": False})
    assert convert(tmp, ["--tokenizer", write_json(d2, "tokenizer.json", hand_tokenizer()), src])[0] == hello + [261]
    write_json(d, "tokenizer_config.json", {"eos_token": "<|nope|>"})
    r, _ = run_convert(tmp, ["--tokenizer", tj2, src])
    assert r.returncode == 2 and b"eos_token: \"<|nope|>\" is not a token" in r.stderr, r.stderr
    # No EOS known at all: an error saying what to do, unless --eod is given.
    tj3 = write_json(tmp, "noeos.json", hand_tokenizer(lambda j: j["added_tokens"].pop()))
    r, _ = run_convert(tmp, ["--tokenizer", tj3, src])
    assert r.returncode == 2 and b"give --eod ID or --eod none" in r.stderr, r.stderr
    assert convert(tmp, ["--tokenizer", tj3, "--eod", "none", src])[0] == [260] + hello
    # A ranks file: Llama 3's BOS by default too, none for GPT-2's (test_tokenizer.py checks the ids).


def merge_order(tmp):
    """The merges list orders the merges, not the ids of the tokens they make; ignore_merges."""
    def el_first(ignore_merges):
        def f(j):
            j["model"]["vocab"]["el"] = 260  # made by the first merge, yet the highest id
            j["model"]["merges"].insert(0, ["e", "l"])
            j["model"]["ignore_merges"] = ignore_merges
            j["added_tokens"][0]["id"], j["added_tokens"][1]["id"] = 261, 262  # after the vocabulary
            j["post_processor"]["special_tokens"][BOS_TEXT]["ids"] = [261]
        return f
    src = jsonl(tmp, "m", ["hellox", "hello"])
    h, el, l, o, x = 104, 260, 108, 111, 120
    for ignore, want in [(True, [[h, el, l, o, x], [259]]), (False, [[h, el, l, o, x], [h, el, l, o]])]:
        tj = write_json(tmp, "order.json", hand_tokenizer(el_first(ignore)))
        got = convert(tmp, ["--tokenizer", tj, "--bos", "none", "--eod", "none", src])
        assert got == want, "ignore_merges %s: got %s, want %s" % (ignore, got, want)
        tk = import_module("tokenizers")
        if not isinstance(tk, Exception):  # the expectation is the library's too
            lib = tk.Tokenizer.from_file(tj)
            assert [lib.encode(t, add_special_tokens=False).ids for t in ["hellox", "hello"]] == want


def added_tokens_and_variants(tmp):
    """Against the library, on hand-written variants: non-special added tokens (normalized or not,
    two overlapping a special token's text, which ordinary mode finds and skips whole: "begin_of" in
    "<|begin_of_text|>" is not matched), a special one with normalized true, a Split on a String, a
    merge listed twice (the later index counts)."""
    lib_module = tokenizers()
    texts = ["hello <x> hel<x>lo", BOS_TEXT + "he<x>", "<|begin<x>", "a" + EOS_TEXT + "b <y>z<y", "hellohello he ll o",
             "x<xy>y <x><x>", "hellox"]

    def added(j):
        for k, (text, special, normalized) in enumerate([("<x>", False, True), ("<xy>", False, False),
                                                         ("<y>", True, True), ("<|begin", False, False),
                                                         ("begin_of", False, False)]):
            j["added_tokens"].append({"id": 262 + k, "content": text, "special": special, "normalized": normalized,
                                      "lstrip": False, "rstrip": False, "single_word": False})

    def string_split(j):
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"String": "l"}

    def merge_twice(j):  # e+l first and last: it merges last ("hellox" -> hello x, not h el l o x)
        j["model"]["vocab"]["el"] = 260
        j["model"]["merges"] = [["e", "l"]] + j["model"]["merges"] + [["e", "l"]]
        j["added_tokens"][0]["id"], j["added_tokens"][1]["id"] = 261, 262
        j["post_processor"]["special_tokens"][BOS_TEXT]["ids"] = [261]
    src = jsonl(tmp, "v", texts)
    for name, f in [("added tokens", added), ("a String split", string_split), ("a merge twice", merge_twice)]:
        tj = write_json(tmp, "variant.json", hand_tokenizer(f))
        lib = lib_module.Tokenizer.from_file(tj)
        for mode in ("ordinary", "match"):
            lib.encode_special_tokens = mode == "ordinary"
            want = [lib.encode(t, add_special_tokens=False).ids for t in texts]
            got = convert(tmp, ["--tokenizer", tj, "--bos", "none", "--eod", "none", "--special-tokens", mode, src])
            assert got == want, "%s, %s:\n  got  %s\n  want %s" % (name, mode, got, want)


def regex_translation(tmp):
    """Split regexes using the escapes whose meaning differs between Oniguruma and PCRE2 (\\s, \\d,
    their negations, \\v, \\uHHHH, \\x{...}, escaped symbols, inside and outside classes), on the
    varied corpus and text made for them, against the library. Every piece the library's
    pre-tokenizer cuts is made a token (ignore_merges), so any other cut gives other ids."""
    lib_module = tokenizers()
    from tokenizers import pre_tokenizers, Regex
    texts = varied_corpus()[:120] + ["a\u00e9b 12\u0663\u00bd x_y\u203fz \u0301 \x0b\x0c tab\tnl\n ~!@ (x) [y] {z} "
                                     "a.b|c \\ done \u2014"]
    src = jsonl(tmp, "rx", texts)
    for rx in [r"\d+|\p{L}+|\u00e9|[\s\p{P}]+|\x{2014}|\(|\)|\[|\]|\{|\}|\||\.|\\|\v|[^\d\s]+|.",
               r"\D+|\d", r"[\d\s']+|[^\d\s']+", r"\S+|\s+", r"[\p{N}\p{L}]+|\P{L}"]:
        cut = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rx), behavior="isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        pieces = sorted(set(p for t in texts for p, _ in cut.pre_tokenize_str(t)))

        def f(j):
            j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": rx}
            vocab = j["model"]["vocab"]
            for p in pieces:
                if p not in (BOS_TEXT, EOS_TEXT):  # those stay added tokens, outside the vocabulary
                    vocab.setdefault(p, len(vocab))
            for k, a in enumerate(j["added_tokens"]):
                a["id"] = len(vocab) + k
            j["post_processor"]["special_tokens"][BOS_TEXT]["ids"] = [len(vocab)]
        tj = write_json(tmp, "rx.json", hand_tokenizer(f))
        lib = lib_module.Tokenizer.from_file(tj)
        lib.encode_special_tokens = True
        want = [lib.encode(t, add_special_tokens=False).ids for t in texts]
        got = convert(tmp, ["--tokenizer", tj, "--bos", "none", "--eod", "none", src])
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, "regex %r: %d of %d documents differ, the first %r" % (rx, len(bad), len(texts), texts[bad[0]][:40])


def malformed(tmp):
    src = jsonl(tmp, "m", ["hello world"])

    def drop(*keys):
        def f(j):
            o = j
            for k in keys[:-1]:
                o = o[k]
            del o[keys[-1]]
        return f

    def setk(value, *keys):
        def f(j):
            o = j
            for k in keys[:-1]:
                o = o[k]
            o[keys[-1]] = value
        return f

    cases = [
        ("{", "bad JSON"),
        ("{\"model\": 1} x", "bad JSON"),
        (hand_tokenizer(drop("model")), "model: expected an object"),
        (hand_tokenizer(setk("WordPiece", "model", "type")), "model.type: expected \"BPE\""),
        (hand_tokenizer(setk(0.1, "model", "dropout")), "model.dropout is set"),
        (hand_tokenizer(setk("##", "model", "continuing_subword_prefix")), "continuing_subword_prefix is set"),
        (hand_tokenizer(setk([], "model", "vocab")), "model.vocab: expected an object"),
        (hand_tokenizer(setk(999, "model", "vocab", "a")), "model.vocab: \"a\": expected an id in 0..259"),
        (hand_tokenizer(setk("x", "model", "vocab", "a")), "model.vocab: \"a\": expected an id"),
        (hand_tokenizer(setk(0, "model", "vocab", "a")), "model.vocab: id 0 is given twice"),
        (hand_tokenizer(lambda j: j["model"]["vocab"].update({"\u4e2d": 260})), "is not a byte-level token"),
        (hand_tokenizer(drop("model", "vocab", "a")), "expected an id in 0..258 (ids are 0, 1, 2"),
        (hand_tokenizer(setk({}, "model", "merges")), "model.merges: expected an array"),
        (hand_tokenizer(setk(["h e", "l  l"], "model", "merges")), "model.merges[1]: expected \"A B\""),
        (hand_tokenizer(setk(["he"], "model", "merges")), "model.merges[0]: expected \"A B\""),
        (hand_tokenizer(setk([["h"]], "model", "merges")), "model.merges[0]: expected \"A B\""),
        (hand_tokenizer(setk([["h", "zz"]], "model", "merges")), "model.merges[0]: \"zz\" is not in model.vocab"),
        (hand_tokenizer(setk([["o", "h"]], "model", "merges")), "model.merges[0]: \"o\" + \"h\" is not in"),
        (hand_tokenizer(setk({"type": "NFC"}, "normalizer")), "normalizer: not supported"),
        (hand_tokenizer(setk(None, "pre_tokenizer")), "pre_tokenizer: expected an object"),
        (hand_tokenizer(setk({"type": "Whitespace"}, "pre_tokenizer")), "type \"Whitespace\" is not supported"),
        (hand_tokenizer(setk({"type": "ByteLevel", "add_prefix_space": True}, "pre_tokenizer")),
         "add_prefix_space true is not supported"),
        (hand_tokenizer(setk({"type": "ByteLevel", "use_regex": False}, "pre_tokenizer")), "pre_tokenizer: no regex"),
        (hand_tokenizer(setk("Removed", "pre_tokenizer", "pretokenizers", 0, "behavior")),
         "pretokenizers[0].behavior: only \"Isolated\""),
        (hand_tokenizer(setk({"Regex": "(unclosed"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "cannot compile the pre-tokenizer regex"),
        (hand_tokenizer(setk({"Regex": "[a-z&&[^aeiou]]"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "nested character classes are not supported"),
        (hand_tokenizer(setk({"Regex": "[^\\S]+"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "the escape \\S inside a character class is not supported"),
        (hand_tokenizer(setk({"Regex": "\\h+"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "the escape \\h is not supported"),
        (hand_tokenizer(setk({"Regex": "\\w+|\\W"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "the escape \\w is not supported"),
        (hand_tokenizer(setk({"Regex": "x*"}, "pre_tokenizer", "pretokenizers", 0, "pattern")),
         "matched empty text"),
        (hand_tokenizer(setk({}, "added_tokens")), "added_tokens: expected an array"),
        (hand_tokenizer(setk(-1, "added_tokens", 0, "id")), "added_tokens[0]: expected {\"id\""),
        (hand_tokenizer(setk("", "added_tokens", 0, "content")), "added_tokens[0]: expected {\"id\""),
        (hand_tokenizer(setk(260, "added_tokens", 1, "id")), "added_tokens[1]: \"<|end_of_text|>\" or id 260 is "
                                                             "given twice"),
        (hand_tokenizer(setk(5, "added_tokens", 0, "id")), "model.vocab has another token at that id"),
        (hand_tokenizer(setk(262, "added_tokens", 1, "id")), "has id 262, but the tokenizers library gives it 261"),
        (hand_tokenizer(setk("he", "added_tokens", 0, "content")), "model.vocab gives it another id"),
        (hand_tokenizer(lambda j: j["added_tokens"].append({"id": 262, "content": "<x>", "special": False,
                                                            "lstrip": True})), "lstrip, rstrip or single_word"),
        (hand_tokenizer(setk("<nope>", "post_processor", "single", 0, "SpecialToken", "id")),
         "post_processor: special token \"<nope>\" is not a token"),
    ]
    for i, (doc, want) in enumerate(cases):
        tj = write_json(tmp, "bad%d.json" % i, doc)
        r, prefix = run_convert(tmp, ["--tokenizer", tj, src], name="bad")
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 2, "case %d (%s): exit %d, stderr %r" % (i, want, r.returncode, err)
        assert err.count("\n") == 1 and err.startswith("wlbtrain: error: ") and want in err, \
            "case %d: want one error line with %r, got %r" % (i, want, err)
        assert not os.path.exists(prefix + ".idx") and not os.path.exists(prefix + ".bin")
    # Options that need a tokenizer.json, or do not go with one.
    tj = write_json(tmp, "good.json", hand_tokenizer())
    rstrip = write_json(tmp, "rstrip.json", hand_tokenizer(setk(True, "added_tokens", 1, "rstrip")))
    assert convert(tmp, ["--tokenizer", rstrip, src])  # a special token's rstrip matters only when matched
    for args, want in [(["--tokenizer", rstrip, "--special-tokens", "match"],
                        "--special-tokens: added token '<|end_of_text|>' has lstrip, rstrip or single_word set"),
                       (["--tokenizer", tj, "--pattern", "gpt2"], "--pattern: not with a tokenizer.json"),
                       (["--special-tokens", "match"], "--special-tokens: match needs a tokenizer.json"),
                       (["--special-tokens", "all"], "--special-tokens: expected one of ordinary|match"),
                       (["--bos", "x"], "--bos: expected a token id or 'none'"),
                       (["--tokenizer", tj, "--bos", "70000", "--dtype", "uint16"], "--bos: id 70000 does not fit")]:
        r, _ = run_convert(tmp, args + [src], name="bad")
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 2 and err.count("\n") == 1 and want in err, "%s: exit %d, %r" % (args, r.returncode, err)


TESTS = [
    ("the real tokenizer.json files: vocabulary, BOS, EOD, and the regex as the known pattern", real_summaries),
    ("llama3 tokenizer.json ids equal the tokenizers library's on the libc6-dev headers",
     llama3_ids(headers, ("ordinary",))),
    ("llama3 tokenizer.json ids equal the library's on the Python standard library",
     llama3_ids(stdlib_sample, ("ordinary",))),
    ("llama3 tokenizer.json ids equal the library's on a varied unicode corpus", llama3_ids(varied_corpus)),
    ("llama3 tokenizer.json ids equal the library's on text with special-token strings", llama3_ids(llama3_specials)),
    ("gpt2 tokenizer.json ids equal the library's on the libc6-dev headers", gpt2_ids(headers, ("ordinary",))),
    ("gpt2 tokenizer.json ids equal the library's on the Python standard library",
     gpt2_ids(stdlib_sample, ("ordinary",))),
    ("gpt2 tokenizer.json ids equal the library's on a varied unicode corpus", gpt2_ids(varied_corpus)),
    ("gpt2 tokenizer.json ids equal the library's on text with special-token strings", gpt2_ids(gpt2_specials)),
    ("a trained GPT-2-style BPE (merges as pairs): ids equal the library's", fixture_ids(False)),
    ("a trained Llama-3-style BPE (merges as strings, BOS template): ids equal the library's", fixture_ids(True)),
    ("BOS / EOS: on by default, off, other ids, one BOS when the text has it, tokenizer_config.json",
     bos_eos_rules),
    ("merges go by their order in the list, not by the ids they make; ignore_merges", merge_order),
    ("added tokens (special or not, normalized or not, overlapping), a String split, a merge listed twice",
     added_tokens_and_variants),
    ("regexes with the escapes Oniguruma and PCRE2 read differently, against the library", regex_translation),
    ("malformed tokenizer.json files and bad options: one error line, exit status 2, no output", malformed),
]


def main():
    print("1..%d" % len(TESTS))
    failed = 0
    for n, (name, fn) in enumerate(TESTS, 1):
        tmp = tempfile.mkdtemp(prefix="wlbtest-tj-")
        try:
            fn(tmp)
            print("ok %d - %s" % (n, name))
        except Skip as e:
            print("ok %d # SKIP %s" % (n, e))
            print("# skip: %s" % e)
        except Exception:
            import traceback
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
