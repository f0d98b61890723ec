#!/usr/bin/env python3
"""scripts/device/targets.py - what a GPU run measured, against the CUDA backend's targets.

Reads what scripts/device/gpu_check.sh brought back (the folder the device tool puts $OUT's files
in, or logs.tar.gz itself: summary.txt, attention.log, bench.log) and prints one table: each target,
the figure measured, and met / NOT MET / not measured. The targets (docs/cuda.md, "Targets"):

  tests       every step of summary.txt exited 0 with no "not ok"
  attention   at a 32K window of WLB-LLM documents, head sizes 64 and 128: wlbtrain's fastest
              forward + backward (its own kernels or cuDNN's, deterministic or not) at least 1.5x
              FlashAttention-2 varlen's in the same run
  bench       llama3.2-1b shape: wlbtrain (wlb packer, recompute none; own or cuDNN attention, the
              faster) at least 1.3x the tokens/s of PyTorch with FlexAttention + torch.compile at 8K
              and at 32K windows, its peak memory no higher; a 64K window runs; 4 layers of Llama
              3.1 8B at 50% MFU or more at 8K and 32K (wlbtrain's best row); every wlbtrain row's
              memory model within 10% of its measured peak

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
    """{(window, head size): {kernel: (fwd TFLOP/s, fwd+bwd TFLOP/s)}} of bench/attention_kernels.sh's
    tables (a table without a head size is one of a run before the bench had head size 128: 64)."""
    out, key = {}, None
    for line in text.splitlines():
        m = re.match(r"## window (\d+)(?:.*head size (\d+))?", line)
        if m:
            key = (int(m.group(1)), int(m.group(2) or 64))
            out[key] = {}
        elif key and line.startswith("|") and not line.startswith(("|---", "| kernel")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and number(cells[2]) is not None:
                out[key][cells[0]] = (number(cells[2]), number(cells[4]))
    return out


def bench(text):
    """Rows of bench/gpu_throughput.sh: (implementation, window, tokens/s (None: failed), peak GB,
    predicted GB, the failure's text, MFU in %)."""
    rows = []
    for c in table_rows(text):
        if len(c) < 7 or c[0] == "implementation" or number(c[1]) is None:
            continue
        failed = c[2].startswith("failed")
        pred = number(c[6]) if c[6] else None
        rows.append((c[0], int(number(c[1])), None if failed else number(c[2]),
                     None if failed else number(c[5]), pred, c[2] if failed else "",
                     None if failed else number(c[4])))
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

    att = attention(logs.get("attention.log", ""))
    for D in (64, 128):
        rows_d = att.get((32768, D), {})
        ours = [(k, v) for k, v in rows_d.items() if k.startswith("wlbtrain")]
        fa2 = next((v for k, v in rows_d.items() if k.startswith("FlashAttention-2")), None)
        goal = "attention, 32K, head size %d: fwd + bwd >= 1.5x FlashAttention-2 varlen" % D
        if ours and fa2:
            name, best = max(ours, key=lambda kv: kv[1][1])
            res.append((goal, "%.0f TFLOP/s (%s) / %.0f = %.2fx" % (best[1], name, fa2[1], best[1] / fa2[1]),
                        verdict(best[1] >= 1.5 * fa2[1])))
        else:
            res.append((goal, "wlbtrain rows %d, FlashAttention-2 row %s" % (len(ours), "found" if fa2 else "absent"),
                        "not measured"))

    rows = bench(logs.get("bench.log", ""))
    for w in (8192, 32768):
        ours = [r for r in rows if r[1] == w and r[0].startswith("wlbtrain, llama3.2-1b, wlb, recompute none")]
        ran = [r for r in ours if r[2] is not None]
        wlb = max(ran, key=lambda r: r[2]) if ran else (ours[0] if ours else None)
        flex = next((r for r in rows if r[1] == w and "FlexAttention" in r[0] and "8b" not in r[0]), None)
        goal = "bench, %dK: tokens/s >= 1.3x FlexAttention + compile" % (w // 1024)
        if not (wlb and flex):
            res.append((goal, "wlbtrain row %s, FlexAttention row %s" % ("found" if wlb else "absent",
                                                                         "found" if flex else "absent"), "not measured"))
        elif wlb[2] is None:
            res.append((goal, "wlbtrain %s" % wlb[5], "NOT MET"))
        elif flex[2] is None:
            res.append((goal, "FlexAttention failed", "not measured"))
        else:
            res.append((goal, "%.0f / %.0f = %.2fx (%s)" % (wlb[2], flex[2], wlb[2] / flex[2], wlb[0]),
                        verdict(wlb[2] >= 1.3 * flex[2])))
            res.append(("bench, %dK: peak memory <= FlexAttention's" % (w // 1024),
                        "%.1f / %.1f GB" % (wlb[3], flex[3]), verdict(wlb[3] <= flex[3])))
        eight = [r for r in rows if r[1] == w and r[0].startswith("wlbtrain, llama3.1-8b") and r[2] is not None]
        goal = "bench, 8B layers, %dK: MFU >= 50%%" % (w // 1024)
        if eight:
            best = max(eight, key=lambda r: r[6])
            res.append((goal, "%.1f%% (%s)" % (best[6], best[0]), verdict(best[6] >= 50)))
        else:
            tried = [r for r in rows if r[1] == w and r[0].startswith("wlbtrain, llama3.1-8b")]
            res.append((goal, "%d rows, none ran" % len(tried) if tried else "-", "NOT MET" if tried else "not measured"))
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
