#!/usr/bin/env python3
"""test/test_ckpt_bind.py - every checkpoint file bound to its run, step and place (docs/checkpoints.md,
"Every file bound to its checkpoint"), and what an older checkpoint gets.

A tiny model trains 4 steps on 4 ranks (tp 2 x dp 2, ZeRO-1; checkpoints after steps 2 and 4: 4 shard
files each, 2 holding weights and moments, 2 moments only), and 2 steps in one process (another run).
1   on disk: index.json is version 3 with the run id, config.yaml's model keys and every file's size
    and CRC-32 (computed here with zlib over the whole file: equal); each shard's ident section names
    the run, the step and the place its file name says; state.bin's names the run and step.
    `wlbtrain inspect` of the checkpoint folder says what it is and that every file was checked.
2   refused, each with one "wlbtrain: error:" line naming the file and what it holds, exit 2, nothing
    written: two TP shards swapped, two ZeRO-1 moment shards swapped (and a TP pair of them), a moment
    shard and state.bin copied in from step 2 (stale), a shard and state.bin of the other run
    (foreign) - by `export`, `eval`, `inspect`, a resume in one process (another layout), a run
    continued from it, and for the first three a resume on the 4 ranks that saved it (the same layout).
3   config.yaml edited: model.rope_theta, model.norm_eps, model.rope_scaling (added), model.d_ffn -
    each refused naming the key, by export and eval (which would write or use them), inspect and a
    resume; an
    edit of a key outside model.* (data.seed) by its checksum. A shard rewritten with a weight changed
    and every CRC of its own made to match (as a tool that rewrites the file would) is refused by the
    CRC-32 of the whole file that index.json lists (checked as each reader opens the file: a moment-only
    shard so by a resume; export and eval read no moments).
4   older checkpoints: the same checkpoint written as an earlier wlbtrain wrote it - index version 2
    (its own checksum, no binding) and version 1 (neither, no layout.stage_layers), shards and
    state.bin without ident sections - is exported (the same model.safetensors bytes as the bound
    checkpoint's), resumed and inspected, each with one warning line saying which checks were not
    possible;
    the resumed run's next checkpoint is bound (version 3). A version-3 index over shards without
    ident sections is refused.
5   the run id: a resume keeps it; a run continued from the checkpoint (checkpoint.continue_from, a
    new stage) gets a new one and records the checkpoint's run and step as its parent.
6   the stop line tells the truth about the checkpoint: 2 ranks, parallel.timeout_s 3, SIGTERM to
    both in the save after step 2 and rank 0 stalling 4 s once that checkpoint is complete (before it
    removes the oldest; WLBTRAIN_FAULT=savestall@0:2): rank 1's watchdog ends it waiting in its next
    collective with a stop pending, exit 75, and its line says the checkpoint of step 2 is complete
    (not "without a checkpoint"); latest names step 2, which exports.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

from taplib import Skip, check, comment, run_tests  # noqa: E402

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 320,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, dp: auto}
data: {path: %(prefix)s, context_window: 64, global_batch_tokens: 256, valid_fraction: 0.2}
balance: {hardware: cpu}
train: {device: cpu, steps: 4, lr: 0.01, warmup_steps: 1, eval_every: 0, eval_tokens: 512}
checkpoint: {every: 2, keep: 10}
log: {every: 100}
"""

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
STEP4, STEP2 = "step-00000004", "step-00000002"


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=ENV,
                          timeout=300, **kw)


def read_statefile(path):
    """The sections of a util/statefile.h file, in order: [(name, bytes)]."""
    with open(path, "rb") as f:
        raw = f.read()
    check(raw[:8] == b"WLBSTATE", path + ": not a state file")
    n = int.from_bytes(raw[12:16], "little")
    out = []
    for i in range(n):
        e = raw[24 + 56 * i:24 + 56 * (i + 1)]
        at, size = int.from_bytes(e[32:40], "little"), int.from_bytes(e[40:48], "little")
        out.append((e[:32].rstrip(b"\0").decode(), raw[at:at + size]))
    return out


def write_statefile(path, sections):
    """util/statefile.h's layout: header, entries with each section's CRC-32, the header's CRC-32, the
    sections at multiples of 8."""
    header = 24 + 56 * len(sections) + 8
    at = (header + 7) & ~7
    entries, body = b"", b""
    for name, data in sections:
        entries += name.encode().ljust(32, b"\0") + struct.pack("<QQII", at, len(data), zlib.crc32(data), 0)
        pad = (-len(data)) % 8
        body += data + b"\0" * pad
        at += len(data) + pad
    head = b"WLBSTATE" + struct.pack("<IIQ", 1, len(sections), at) + entries
    head += struct.pack("<II", zlib.crc32(head), 0)
    with open(path, "wb") as f:
        f.write(head + b"\0" * ((-len(head)) % 8) + body)


def index_crc(d):
    """The index's own checksum (docs/checkpoints.md)."""
    body = dict((k, v) for k, v in d.items() if k != "crc32")
    return "%08x" % (zlib.crc32(json.dumps(body, separators=(",", ":"), sort_keys=True).encode()) & 0xffffffff)


def ident_of(path):
    """The ident section's 13 words, or None."""
    for name, data in read_statefile(path):
        if name == "ident":
            return struct.unpack("<13q", data)
    return None


class Fixture:
    def __init__(self):
        if not shutil.which("mpirun"):
            raise Skip("no mpirun")
        self.dir = tempfile.mkdtemp(prefix="wlbbind-")
        with open(os.path.join(self.dir, "doc.jsonl"), "w") as f:
            for i in range(300):
                f.write(json.dumps({"text": "document %d: the quick brown fox jumps over the lazy dog %d times. "
                                    % (i, 7 * i) * (1 + i % 4)}) + "\n")
        prefix = os.path.join(self.dir, "docs")
        r = run([WLBTRAIN, "convert", "--quiet", "--out", prefix, os.path.join(self.dir, "doc.jsonl")])
        check(r.returncode == 0, "convert failed: %s" % r.stderr)
        self.cfg = os.path.join(self.dir, "tiny.yaml")
        with open(self.cfg, "w") as f:
            f.write(CONFIG % {"prefix": prefix})
        self.a = os.path.join(self.dir, "a")
        r = run(["mpirun", "-np", "4", WLBTRAIN, "--config", self.cfg, "--set", "checkpoint.dir=" + self.a, "--set",
                 "parallel.tp=2", "--set", "parallel.zero=1"])
        check(r.returncode == 0, "training on 4 ranks failed: %s%s" % (r.stdout, r.stderr))
        self.b = os.path.join(self.dir, "b")
        r = run([WLBTRAIN, "--config", self.cfg, "--set", "checkpoint.dir=" + self.b, "--set", "train.steps=2"])
        check(r.returncode == 0, "training in one process failed: %s%s" % (r.stdout, r.stderr))
        self.ref = os.path.join(self.dir, "hf-ref")
        r = run([WLBTRAIN, "export", "--checkpoint", self.a, "--out", self.ref])
        check(r.returncode == 0 and not r.stderr, "export of the intact checkpoint: %s" % r.stderr)

    def copy(self, name, edit=None):
        """A copy of checkpoint a (latest: step 4) as DIR/name, edited in its step 4 folder."""
        dst = os.path.join(self.dir, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(self.a, dst)
        if edit:
            edit(os.path.join(dst, STEP4))
        return dst

    def step4(self, ckpt=None):
        return os.path.join(ckpt or self.a, STEP4)


def listing(path):
    return sorted((d, tuple(sorted(f))) for d, _, f in os.walk(path))


def swap(a, b):
    def edit(step):
        x, y = os.path.join(step, a), os.path.join(step, b)
        os.rename(x, x + ".tmp")
        os.rename(y, x)
        os.rename(x + ".tmp", y)
    return edit


def copy_in(src):
    def edit(step):
        shutil.copy(src, os.path.join(step, os.path.basename(src)))
    return edit


def refused(fx, what, ckpt, expect, four=False):
    """export, eval, inspect, a resume in one process, a run continued from it (checkpoint.continue_from)
    (and with four, a resume on the 4 ranks that saved it) of ckpt:
    each exit 2 with one wlbtrain: error: line holding every piece of expect, nothing written."""
    before = listing(ckpt)
    out = os.path.join(fx.dir, "hf-refused")
    shutil.rmtree(out, ignore_errors=True)
    resume = [WLBTRAIN, "--config", fx.cfg, "--set", "checkpoint.dir=" + ckpt, "--set", "checkpoint.resume=auto",
              "--set", "train.steps=6"]
    cmds = [("export", [WLBTRAIN, "export", "--checkpoint", ckpt, "--out", out]),
            ("eval", [WLBTRAIN, "eval", "--checkpoint", ckpt]),
            ("inspect", [WLBTRAIN, "inspect", ckpt]),
            ("resume in one process", resume)]
    stage = os.path.join(fx.dir, "stage-refused")
    shutil.rmtree(stage, ignore_errors=True)
    cmds.append(("continue_from", [WLBTRAIN, "--config", fx.cfg, "--set", "checkpoint.dir=" + stage, "--set",
                                   "checkpoint.continue_from=" + ckpt, "--set", "train.steps=2"]))
    if four:
        cmds.append(("resume on 4 ranks", ["mpirun", "-np", "4"] + resume + ["--set", "parallel.tp=2", "--set",
                                                                            "parallel.zero=1"]))
    for how, cmd in cmds:
        r = run(cmd)
        lines = [l for l in r.stderr.splitlines() if l.startswith("wlbtrain:")]
        ok = r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: ") and \
            all(e in lines[0] for e in expect)
        check(ok, "%s, %s: exit %d, stderr %r" % (what, how, r.returncode, r.stderr[-1500:]))
        if how == "export":
            comment("%s: %s" % (what, lines[0] if lines else r.stderr.strip()))
        check(not os.path.exists(out), "%s, %s: the export folder was made" % (what, how))
        check(not os.path.exists(os.path.join(stage, "latest")), "%s, %s: the continued run saved" % (what, how))
        check(listing(ckpt) == before, "%s, %s: the checkpoint folder changed" % (what, how))


def test_on_disk(fx):
    step = fx.step4()
    with open(os.path.join(step, "index.json")) as f:
        index = json.load(f)
    check(index["version"] == 3 and index["crc32"] == index_crc(index), "version %r, checksum" % index["version"])
    run_id = index["run"]["id"]
    check(len(run_id) == 16 and "parent" not in index["run"], "run %r" % index["run"])
    check(index["model"].get("model.rope_theta") == "10000" and index["model"].get("model.d_ffn") == "64" and
          index["model"].get("model.norm_eps") == "1e-05", "model %r" % index["model"])
    files = sorted(index["files"]) + ["config.yaml", "state.bin"]
    check(sorted(index["contents"]) == sorted(files), "contents lists %s" % sorted(index["contents"]))
    for name in files:
        with open(os.path.join(step, name), "rb") as f:
            raw = f.read()
        c = index["contents"][name]
        check(c == {"bytes": len(raw), "crc32": "%08x" % zlib.crc32(raw)},
              "%s: %r, the file: %d bytes, %08x" % (name, c, len(raw), zlib.crc32(raw)))
    rid = int(run_id, 16) - (1 << 64 if int(run_id, 16) >= 1 << 63 else 0)
    for name in index["files"]:
        w = ident_of(os.path.join(step, name))
        t, p, z = (int(x) for x in name[len("shard-tp"):-len(".bin")].replace("-pp", " ").replace("-dpcp", " ").split())
        check(w is not None and w[:4] == (1, 0, rid, 4) and w[4:7] == (t, p, z) and w[7:] == (2, 1, 1, 2, 1, 1),
              "%s: ident %r" % (name, w))
    w = ident_of(os.path.join(step, "state.bin"))
    check(w is not None and w[:7] == (1, 1, rid, 4, -1, -1, -1), "state.bin: ident %r" % (w,))
    comment("run %s; %d files listed with size and CRC-32" % (run_id, len(files)))
    r = run([WLBTRAIN, "inspect", fx.a])
    check(r.returncode == 0 and not r.stderr and r.stdout.startswith("checkpoint: %s: after step 4, run %s; index "
                                                                     "version 3; layout tp 2, cp 1, pp 1, dp 2" % (step, run_id)) and
          "every file is this checkpoint's" in r.stdout, "inspect: exit %d, %r %r" % (r.returncode, r.stdout, r.stderr))


def test_swapped_stale_foreign(fx):
    s = "shard-tp%d-pp0-dpcp%d.bin"
    cases = [
        ("two TP shards swapped", swap(s % (0, 0), s % (1, 0)), True,
         [s % (0, 0) + ": holds the shard of tp 1, pp 0, dpcp 0 after step 4", "another rank's file"]),
        ("two ZeRO-1 moment shards swapped", swap(s % (0, 0), s % (0, 1)), True,
         [s % (0, 0) + ": holds the shard of tp 0, pp 0, dpcp 1", "another rank's file"]),
        ("the moment shards of two TP ranks swapped", swap(s % (0, 1), s % (1, 1)), False,
         [s % (0, 1) + ": holds the shard of tp 1, pp 0, dpcp 1", "another rank's file"]),
        ("a moment shard of step 2", copy_in(os.path.join(fx.a, STEP2, s % (1, 1))), True,
         [s % (1, 1) + ": holds the shard of tp 1, pp 0, dpcp 1 after step 2", "stale"]),
        ("state.bin of step 2", copy_in(os.path.join(fx.a, STEP2, "state.bin")), False,
         ["state.bin: holds the training state after step 2", "stale"]),
        ("a shard of another run", copy_in(os.path.join(fx.b, STEP2, s % (0, 0))), False,
         [s % (0, 0) + ": holds the shard of tp 0, pp 0, dpcp 0 after step 2 of run", "a file of another run"]),
        ("state.bin of another run", copy_in(os.path.join(fx.b, STEP2, "state.bin")), False,
         ["state.bin: holds the training state after step 2 of run", "a file of another run"]),
    ]
    for what, edit, four, expect in cases:
        refused(fx, what, fx.copy("case", edit), expect, four)


def sub_config(old, new):
    def edit(step):
        path = os.path.join(step, "config.yaml")
        with open(path) as f:
            text = f.read()
        check(old in text, "config.yaml has no %r" % old)
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))
    return edit


def rewritten_weights(step):
    """shard-tp1-pp0-dpcp0.bin with its first weight changed, every CRC of the file made to match."""
    path = os.path.join(step, "shard-tp1-pp0-dpcp0.bin")
    sections = read_statefile(path)
    for i, (name, data) in enumerate(sections):
        if name.startswith("params."):
            v = struct.unpack_from("<f", data)[0]
            sections[i] = (name, struct.pack("<f", 2 * v + 1) + data[4:])
            break
    write_statefile(path, sections)


def test_edits(fx):
    for key, old, new, expect in (
            ("rope_theta", "rope_theta: 10000", "rope_theta: 20000", "model.rope_theta is 20000, the checkpoint "
             "was saved with 10000 (index.json): config.yaml was edited"),
            ("norm_eps", "norm_eps: 1e-05", "norm_eps: 1e-06", "model.norm_eps is 1e-06, the checkpoint was saved "
             "with 1e-05"),
            ("rope_scaling", "rope_scaling: none", "rope_scaling: linear", "model.rope_scaling is linear, the "
             "checkpoint was saved with the default"),
            ("d_ffn", "d_ffn: 64", "d_ffn: 128", "model.d_ffn is 128, the checkpoint was saved with 64")):
        refused(fx, "config.yaml's %s edited" % key, fx.copy("case", sub_config(old, new)), ["config.yaml: " + expect])
    refused(fx, "config.yaml's data.seed edited", fx.copy("case", sub_config("seed: 1234", "seed: 4321")),
            ["config.yaml: ", "index.json lists", "replaced or changed after the checkpoint was written"])
    refused(fx, "a shard rewritten with a weight changed and its CRCs made to match",
            fx.copy("case", rewritten_weights), ["shard-tp1-pp0-dpcp0.bin: ", "index.json lists", "replaced or changed"])


def make_older(version):
    """The checkpoint as wlbtrain wrote it before the binding: no ident sections, index version 2
    (its checksum) or 1 (none, no layout.stage_layers)."""
    def edit(step):
        with open(os.path.join(step, "index.json")) as f:
            d = json.load(f)
        for name in d["files"] + ["state.bin"]:
            path = os.path.join(step, name)
            write_statefile(path, [(n, b) for n, b in read_statefile(path) if n != "ident"])
        for k in ("run", "model", "contents", "crc32"):
            del d[k]
        d["version"] = version
        if version == 1:
            del d["layout"]["stage_layers"]
        else:
            d["crc32"] = index_crc(d)
        with open(os.path.join(step, "index.json"), "w") as f:
            json.dump(d, f, indent=1)
    return edit


def test_older(fx):
    with open(os.path.join(fx.ref, "model.safetensors"), "rb") as f:
        want = f.read()
    for version in (2, 1):
        ckpt = fx.copy("v%d" % version, make_older(version))
        out = os.path.join(fx.dir, "hf-v%d" % version)
        r = run([WLBTRAIN, "export", "--checkpoint", ckpt, "--out", out])
        warn = [l for l in r.stderr.splitlines() if l.startswith("wlbtrain:")]
        check(r.returncode == 0 and len(warn) == 1 and warn[0].startswith("wlbtrain: warning: ") and
              "index version %d" % version in warn[0] and "cannot be told" in warn[0],
              "version %d, export: exit %d, stderr %r" % (version, r.returncode, r.stderr))
        comment("version %d: %s" % (version, warn[0] if warn else ""))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            check(f.read() == want, "version %d: another model.safetensors than the bound checkpoint's" % version)
        r = run([WLBTRAIN, "--config", fx.cfg, "--set", "checkpoint.dir=" + ckpt, "--set", "checkpoint.resume=auto",
                 "--set", "train.steps=6"])
        warn = [l for l in r.stderr.splitlines() if l.startswith("wlbtrain:")]
        check(r.returncode == 0 and len(warn) == 1 and "index version %d" % version in warn[0],
              "version %d, resume: exit %d, stderr %r" % (version, r.returncode, r.stderr))
        check("after step 4" in r.stdout, "version %d: not resumed after step 4: %r" % (version, r.stdout[-500:]))
        r = run([WLBTRAIN, "inspect", os.path.join(ckpt, STEP4)])
        warn = [l for l in r.stderr.splitlines() if l.startswith("wlbtrain:")]
        check(r.returncode == 0 and len(warn) == 1 and "index version %d" % version in warn[0] and
              "cannot be checked (older format)" in r.stdout, "version %d, inspect: exit %d, %r %r"
              % (version, r.returncode, r.stdout, r.stderr))
        with open(os.path.join(ckpt, "step-00000006", "index.json")) as f:
            d = json.load(f)
        check(d["version"] == 3 and len(d["run"]["id"]) == 16, "version %d: the next checkpoint %r" % (version, d["run"]))
    # A version-3 index over shards written without their ident.
    def strip_ident(step):
        name = "shard-tp0-pp0-dpcp1.bin"
        path = os.path.join(step, name)
        write_statefile(path, [(n, b) for n, b in read_statefile(path) if n != "ident"])
    refused(fx, "a bound index over a shard without its ident", fx.copy("case", strip_ident),
            ["shard-tp0-pp0-dpcp1.bin: no ident section"])


def test_run_id(fx):
    with open(os.path.join(fx.step4(), "index.json")) as f:
        first = json.load(f)["run"]["id"]
    with open(os.path.join(fx.a, STEP2, "index.json")) as f:
        check(json.load(f)["run"]["id"] == first, "the run's two checkpoints have two run ids")
    ckpt = fx.copy("resumed")
    r = run([WLBTRAIN, "--config", fx.cfg, "--set", "checkpoint.dir=" + ckpt, "--set", "checkpoint.resume=auto",
             "--set", "train.steps=6"])
    check(r.returncode == 0, "resume: %s" % r.stderr)
    with open(os.path.join(ckpt, "step-00000006", "index.json")) as f:
        check(json.load(f)["run"] == {"id": first}, "a resume changed the run id")
    stage = os.path.join(fx.dir, "stage2")
    r = run([WLBTRAIN, "--config", fx.cfg, "--set", "checkpoint.dir=" + stage, "--set", "checkpoint.resume=auto",
             "--set", "checkpoint.continue_from=" + fx.a, "--set", "train.steps=2"])
    check(r.returncode == 0, "continue_from: %s" % r.stderr)
    with open(os.path.join(stage, STEP2, "index.json")) as f:
        run_ = json.load(f)["run"]
    check(run_["id"] != first and run_.get("parent") == {"id": first, "step": 4},
          "a continued run: %r (parent run %s, step 4)" % (run_, first))
    comment("resumed: run %s kept; continued: run %s, parent %s after step 4" % (first, run_["id"], first))


def test_stop_line(fx):
    ckpt = os.path.join(fx.dir, "stall")
    env = dict(ENV, WLBTRAIN_FAULT="savestall@0:2", WLBTRAIN_FAULT_SLOW_S="4")
    r = subprocess.run(["mpirun", "-np", "2", "-x", "WLBTRAIN_FAULT", "-x", "WLBTRAIN_FAULT_SLOW_S", WLBTRAIN,
                        "--config", fx.cfg, "--set", "checkpoint.dir=" + ckpt, "--set", "parallel.timeout_s=3",
                        "--set", "train.steps=6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, env=env, timeout=120)
    stop = [l for l in r.stderr.splitlines() if "stop signal while waiting" in l]
    comment(stop[0] if stop else r.stderr[-1500:])
    check(r.returncode == 75 and len(stop) == 1, "exit %d, stderr %r" % (r.returncode, r.stderr[-1500:]))
    check(stop and "the newest checkpoint, of step 2, is complete (resume goes on from it)" in stop[0] and
          "without a checkpoint" not in stop[0], "the stop line: %r" % stop)
    with open(os.path.join(ckpt, "latest")) as f:
        check(f.read().strip() == STEP2, "latest does not name step 2")
    r = run([WLBTRAIN, "export", "--checkpoint", ckpt, "--out", os.path.join(fx.dir, "hf-stall")])
    check(r.returncode == 0 and not r.stderr, "the checkpoint of step 2: %s" % r.stderr)


TESTS = [("index version 3 lists every file's size and CRC-32; every file's ident names its run, step, place",
          test_on_disk),
         ("swapped, stale and foreign shards and state.bin: one line, exit 2, nothing written", test_swapped_stale_foreign),
         ("edited model keys of config.yaml, other edits, a consistently rewritten shard: refused", test_edits),
         ("older checkpoints (index versions 2 and 1) load with one warning; a bound index needs idents", test_older),
         ("the run id: kept by a resume, new with its parent for a continued run", test_run_id),
         ("a stop once the checkpoint is complete: the stop line says so", test_stop_line)]


if __name__ == "__main__":
    sys.exit(run_tests(TESTS, Fixture, lambda fx: shutil.rmtree(fx.dir, ignore_errors=True)))
