#!/usr/bin/env python3
"""scripts/device/targets.py - what a GPU run measured, against the CUDA backend's targets.

Reads what scripts/device/gpu_check.sh brought back (the folder the device tool puts $OUT's files
in, or logs.tar.gz itself: summary.txt, attention.log, bench.log) and prints one table: each target,
the figure measured, and met / NOT MET / not measured. The targets (docs/cuda.md, "Targets"):

  tests       every step of summary.txt exited 0 with no "not ok"
  attention   wlbtrain's forward + backward at a 32K window (deterministic backward, the default)
              at least 250 TFLOP/s (FlashAttention-2 varlen: 246 on an H100), its forward at least 300
  bench       wlbtrain (wlb packer, recompute none) at least 1.2x the tokens/s of PyTorch with
              FlexAttention + torch.compile at 8K and at 32K windows; its peak memory no higher;
              a 64K window runs; every wlbtrain row's memory model within 10% of its measured peak

A figure missing from the logs (a step skipped or cut by the deadline) is "not measured", never a
guess. Usage: python3 scripts/device/targets.py DIR_OR_TAR_GZ
"""
import io
import os
import re
import sys
import tarfile


def read_logs(path):
    """{file name: text} of the folder or the .tar.gz (a folder's logs.tar.gz is read too)."""
    logs = {}
    tars = [path] if os.path.isfile(path) else []
    if os.path.isdir(path):
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if name.endswith(".tar.gz"):
                tars.append(full)
            elif os.path.isfile(full):
                logs[name] = open(full, errors="replace").read()
    for t in tars:
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.isfile():
                    logs[os.path.basename(m.name)] = io.TextIOWrapper(tf.extractfile(m), errors="replace").read()
    return logs


def table_rows(text):
    """The cells of each markdown table row that is not a header or a rule."""
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            yield [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell):
    m = re.match(r"[-+]?\d*\.?\d+", cell.replace(",", ""))
    return float(m.group(0)) if m else None


def attention(text):
    """{window: {kernel: (fwd TFLOP/s, fwd+bwd TFLOP/s)}} of bench/attention_kernels.sh's tables at
    head size 64, the targets' (a table without a head size is one of a run before the bench had
    head size 128 too); the other head sizes' tables are not read."""
    out, window = {}, None
    for line in text.splitlines():
        m = re.match(r"## window (\d+)(?:.*head size (\d+))?", line)
        if m:
            window = int(m.group(1)) if m.group(2) in (None, "64") else None
            if window:
                out[window] = {}
        elif window and line.startswith("|") and not line.startswith(("|---", "| kernel")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and number(cells[2]) is not None:
                out[window][cells[0]] = (number(cells[2]), number(cells[4]))
    return out


def bench(text):
    """Rows of bench/gpu_throughput.sh: (implementation, window, tokens/s (None: failed), peak GB,
    predicted GB, the failure's text)."""
    rows = []
    for c in table_rows(text):
        if len(c) < 7 or c[0] == "implementation" or number(c[1]) is None:
            continue
        failed = c[2].startswith("failed")
        pred = number(c[6]) if c[6] else None
        rows.append((c[0], int(number(c[1])), None if failed else number(c[2]),
                     None if failed else number(c[5]), pred, c[2] if failed else ""))
    return rows


def main(argv):
    if len(argv) != 2 or not os.path.exists(argv[1]):
        print("usage: targets.py DIR_OR_TAR_GZ (what scripts/device/gpu_check.sh returned)", file=sys.stderr)
        return 2
    logs = read_logs(argv[1])
    res = []  # (target, measured, verdict)

    def verdict(ok):
        return "met" if ok else "NOT MET"

    summary = [l for l in logs.get("summary.txt", "").splitlines() if re.match(r"\S+\s+(exit|skipped)", l)]
    gpu = next((l for l in logs.get("summary.txt", "").splitlines() if l.startswith("GPU")), "GPU: not named")
    if summary:
        bad = [l.split()[0] for l in summary if not re.search(r"exit\s+0\s.*\s0 not ok$", l)]
        res.append(("tests: every step exits 0, no test fails", "%d steps; failing or cut: %s"
                    % (len(summary), ", ".join(bad) or "none"), verdict(not bad)))
    else:
        res.append(("tests: every step exits 0, no test fails", "no summary.txt", "not measured"))

    att = attention(logs.get("attention.log", "")).get(32768, {})
    ours = next((v for k, v in att.items() if k.startswith("wlbtrain") and "atomic" not in k), None)
    others = [(label, v) for label, prefix in (("FlashAttention-2 varlen", "FlashAttention-2"), ("FlexAttention", "flex"))
              for k, v in att.items() if k.startswith(prefix)]
    for i, name, goal in ((1, "fwd + bwd", 250), (0, "forward", 300)):
        if ours:
            beside = ", ".join("%s %.0f" % (label, v[i]) for label, v in others)
            res.append(("attention, 32K: %s >= %d TFLOP/s" % (name, goal),
                        "%.0f%s" % (ours[i], " (%s)" % beside if beside else ""), verdict(ours[i] >= goal)))
        else:
            res.append(("attention, 32K: %s >= %d TFLOP/s" % (name, goal), "-", "not measured"))

    rows = bench(logs.get("bench.log", ""))
    for w in (8192, 32768):
        wlb = next((r for r in rows if r[1] == w and r[0].startswith("wlbtrain") and ", wlb, recompute none" in r[0]), None)
        flex = next((r for r in rows if r[1] == w and "FlexAttention" in r[0]), None)
        goal = "bench, %dK: tokens/s >= 1.2x FlexAttention + compile" % (w // 1024)
        if not (wlb and flex):
            res.append((goal, "wlbtrain row %s, FlexAttention row %s" % ("found" if wlb else "absent",
                                                                         "found" if flex else "absent"), "not measured"))
        elif wlb[2] is None:
            res.append((goal, "wlbtrain %s" % wlb[5], "NOT MET"))
        elif flex[2] is None:
            res.append((goal, "FlexAttention failed", "not measured"))
        else:
            res.append((goal, "%.0f / %.0f = %.2fx" % (wlb[2], flex[2], wlb[2] / flex[2]), verdict(wlb[2] >= 1.2 * flex[2])))
            res.append(("bench, %dK: peak memory <= FlexAttention's" % (w // 1024),
                        "%.1f / %.1f GB" % (wlb[3], flex[3]), verdict(wlb[3] <= flex[3])))
    big = [r for r in rows if r[1] >= 65536 and r[0].startswith("wlbtrain")]
    res.append(("bench: a 64K window runs", "%d of %d rows ran" % (sum(1 for r in big if r[2]), len(big)) if big else "-",
                verdict(any(r[2] for r in big)) if big else "not measured"))
    mem = [(r[0], r[1], r[4] / r[3] - 1) for r in rows if r[0].startswith("wlbtrain") and r[2] and r[3] and r[4]]
    if mem:
        worst = max(mem, key=lambda m: abs(m[2]))
        res.append(("bench: memory model within 10% of the peak", "worst %+.1f%% (%s, %d)" % (100 * worst[2], worst[0], worst[1]),
                    verdict(abs(worst[2]) <= 0.10)))
    else:
        res.append(("bench: memory model within 10% of the peak", "-", "not measured"))

    print("# targets of the CUDA backend, from %s; %s" % (argv[1], gpu))
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for r in res:
        print("| %s | %s | %s |" % r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
