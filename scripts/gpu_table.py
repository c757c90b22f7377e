#!/usr/bin/env python3
"""Combines one GPU job's CSVs into a markdown table: pagedattn against FlashInfer and the seed.

    scripts/gpu_table.py [--ceiling GBPS] [--md TABLE.md] [--png PLOT.png] PATH...

PATH: CSV files, or folders whose *.csv (and *.txt / *.log, for the read ceiling) are read.
Recognized by their header: pagedattn-bench --csv, FlashInfer's fi_decode_bench (and its older
column orders), the seed's gpu_anchors.py, and for MLA decode pagedattn-bench --mla --csv and
FlashInfer's fi_mla_bench --csv. Rows of pagedattn's format without a header (an A/B label in
front, or in place of the backend) are read too. One table row per shape, q dtype, K/V dtype
and q_len; ratio = pagedattn time / FlashInfer's fastest path on that row (below 1: pagedattn is
faster); % = K/V bytes read / time / the read ceiling. The MLA rows get sections of their own
(B,H,ctx,BS; the latent bytes each request's context holds, read once). Repeated rows of one
implementation give their median. Stdlib only; the plot needs matplotlib and is skipped without.
"""
import argparse
import csv
import glob
import os
import re
import statistics
import sys
from collections import OrderedDict, defaultdict, namedtuple

DTYPES = {"f32", "f16", "bf16", "float32", "float16", "bfloat16"}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
DTYPE_ORDER = {"bf16": 0, "f16": 1, "f32": 2}  # the order of the table's sections
# pagedattn-bench's columns after `backend`, for rows that come without a header.
OURS_COLS = ("dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,pct_read_bw,rel_err,"
             "window,soft_cap,alibi,sinks,q_len,layout,kv_dtype").split(",")
IGNORED = ()  # a row read but not tabled (the seed's naive kernel, torch)
# One line of the table: its section (dtype, kv_dtype, q_len), the markdown cells, the ratio
# (None without a FlashInfer row) and, for the plot, the implementation and the three % columns.
Line = namedtuple("Line", "section cells ratio impl pct_ours pct_fi pct_seed")
CEILING_PATTERNS = (  # most trusted first: readbw.cu, then pagedattn-bench's own measurement
    re.compile(r"read ceiling ([0-9.]+) GB/s"),
    re.compile(r"GPU read bandwidth: ([0-9.]+)"),
)


def key_of(d, dtype, kv_dtype, q_len, bs):
    shape = tuple(int(d[c]) for c in ("batch", "heads", "kv_heads", "head_dim", "context"))
    return (dtype, kv_dtype, int(q_len), shape, int(bs))


def ours_row(d, label):
    """A pagedattn-bench row: ((name, variants), key, (ms, gbps), the ceiling its pct implies)."""
    dtype = SHORT.get(d["dtype"], d["dtype"])
    variants = []
    if d.get("window", "-1") not in ("", "-1"):
        variants.append("window " + d["window"])
    if d.get("soft_cap", "0") not in ("", "0"):
        variants.append("soft-cap " + d["soft_cap"])
    variants += [v for v in ("alibi", "sinks") if d.get(v, "0") == "1"]
    if d.get("layout", "hnd") not in ("", "hnd"):
        variants.append(d["layout"])
    if d.get("tree", "0") == "1":
        variants.append("tree mask")
    if d.get("token_scales", "0") == "1":
        variants.append("token scales")
    if d.get("batch_invariant", "0") == "1":
        variants.append("batch-invariant")
    impl = (label or "pagedattn", ", ".join(variants))
    key = key_of(d, dtype, d.get("kv_dtype") or dtype, d.get("q_len") or 1, d["block_size"])
    gbps, pct = float(d["gbps"]), float(d["pct_read_bw"])
    return impl, key, (float(d["ms"]), gbps), 100 * gbps / pct if pct > 0 else None


def fi_row(d):
    if d["max_abs_err"].startswith("FAIL"):
        return None
    impl = d["backend"].replace("flashinfer-", "").replace("prefill-", "")
    key = key_of(d, d["dtype"], d.get("kv_dtype") or "bf16", d.get("q_len") or 1, d["block_size"])
    return impl, key, (float(d["us_graph"]) / 1e3, float(d["gbps"])), None


def mla_key(d):
    """An MLA row's key: (q dtype, latent dtype, q_len, (batch, heads, context), block size)."""
    shape = tuple(int(d[c]) for c in ("batch", "heads", "context"))
    return (SHORT.get(d["dtype"], d["dtype"]), d["kv_dtype"], int(d["q_len"]), shape,
            int(d["block_size"]))


def mla_ours_row(d):
    """A pagedattn-bench --mla row: (name, key, (ms, gbps), the ceiling its pct implies)."""
    name = "pagedattn" + (" (batch-invariant)" if d.get("batch_invariant", "0") == "1" else "")
    gbps, pct = float(d["gbps"]), float(d["pct_read_bw"])
    return name, mla_key(d), (float(d["ms"]), gbps), 100 * gbps / pct if pct > 0 else None


def mla_fi_row(d):
    """A fi_mla_bench row: (path, key, (ms of a graph replay, gbps, ms of a plain call), None);
    None for a row whose check failed."""
    if d["rel_err"].startswith("FAIL"):
        return None
    impl = d["backend"].replace("flashinfer-mla-", "")
    return impl, mla_key(d), (float(d["ms"]), float(d["gbps"]), float(d["ms_plain"])), None


def seed_row(d):
    if not d["impl"].startswith("seed_split"):
        return IGNORED
    if d["ms"] == "ERR":
        return None
    named = {"batch": d["B"], "heads": d["H"], "kv_heads": d["KV"], "head_dim": d["D"],
             "context": d["ctx"]}
    dtype = SHORT.get(d["dtype"], d["dtype"])
    return (d["impl"], key_of(named, dtype, dtype, 1, 16), (float(d["ms"]), float(d["kv_GBps"])),
            None)


def kind_of(header):
    if "us_graph" in header:
        return "fi"
    if "impl" in header and "kv_GBps" in header:
        return "seed"
    if "backend" in header and "ms_plain" in header and "kv_heads" not in header:
        return "mla_fi"
    if "backend" in header and "pct_read_bw" in header and "kv_heads" not in header:
        return "mla_ours"
    if "backend" in header and "ms" in header:
        return "ours"
    return None


def headerless(fields):
    """A pagedattn row without a header: the fields before the dtype are its label."""
    for i, f in enumerate(fields[:3]):
        if f in DTYPES and len(fields) - i >= 11 and fields[i + 1].isdigit():
            d = dict(zip(OURS_COLS, fields[i:]))
            return "/".join(x for x in fields[:i] if x != "cuda"), d
    return None


def parse(fields, header, kind):
    """One data line under `header` (None: a pagedattn row without a header)."""
    if kind is None:
        hl = headerless(fields)
        return ours_row(hl[1], hl[0]) if hl else None
    d = dict(zip(header, fields))
    if kind in ROW_READERS:
        return ROW_READERS[kind](d)
    cut = header.index("backend")  # the columns before it hold an A/B label
    return ours_row(d, "/".join(fields[:cut] + [d["backend"]] * (d["backend"] != "cuda")))


ROW_READERS = {"fi": fi_row, "seed": seed_row, "mla_ours": mla_ours_row, "mla_fi": mla_fi_row}


def read_csv(path, rows, notes):
    header, kind, skipped = None, None, 0
    with open(path, newline="") as f:
        for fields in csv.reader(f):
            if not fields or fields[0].startswith("#"):
                continue
            if kind_of(fields):
                header, kind = fields, kind_of(fields)
                continue
            try:
                row = parse(fields, header, kind)
            except (KeyError, ValueError, TypeError):
                row = None
            if not row:
                skipped += row is None
                continue
            impl, key, sample, implied = row
            rows[kind or "ours"][key][impl].append(sample)
            if implied:
                rows["implied"].append(implied)
    if skipped:
        notes.append(f"{path}: {skipped} line(s) not used (a failed check, or not understood)")


def find_ceiling(paths):
    for pattern in CEILING_PATTERNS:
        for p in paths:
            try:
                with open(p, errors="replace") as f:
                    m = pattern.search(f.read())
            except OSError:
                continue
            if m:
                return float(m.group(1)), os.path.basename(p)
    return None, None


def expand(paths):
    csvs, texts = [], []
    for p in paths:
        if os.path.isdir(p):
            csvs += sorted(glob.glob(os.path.join(p, "*.csv")))
            texts += sorted(glob.glob(os.path.join(p, "*.txt")))
            texts += sorted(glob.glob(os.path.join(p, "*.log")))
        else:
            csvs.append(p)
    return csvs, texts + csvs


def med(samples):
    """The median of each position of the samples' tuples (ms, gbps, ...)."""
    return tuple(statistics.median(s[i] for s in samples) for i in range(len(samples[0])))


def fmt(x, spec, missing="-"):
    return missing if x is None else format(x, spec)


def table_lines(rows, ceiling):
    """A Line per pagedattn implementation and key, in the order the keys were read."""
    out = []
    multi = len({i for per_key in rows["ours"].values() for i in per_key}) > 1
    for key, impls in rows["ours"].items():
        fi = {impl: med(s) for impl, s in rows["fi"].get(key, {}).items()}
        best_fi = min(fi.items(), key=lambda kv: kv[1][0]) if fi else None
        seeds = [med(s) for s in rows["seed"].get(key, {}).values()]
        seed = min(seeds) if seeds else None
        for (name, variants), samples in impls.items():
            ms, gbps = med(samples)
            impl = name + (f" ({variants})" if variants else "")
            # FlashInfer's rows are plain decode: no ratio against a row with variants on.
            ratio = ms / best_fi[1][0] if best_fi and not variants else None
            pct = lambda g: 100 * g / ceiling if ceiling else None  # noqa: E731
            cells = [",".join(map(str, key[3] + (key[4],)))] + ([impl] if multi else []) + [
                fmt(ms * 1e3, ".1f"), fmt(pct(gbps), ".1f"),
                fmt(best_fi and best_fi[1][0] * 1e3, ".1f"), best_fi[0] if best_fi else "-",
                fmt(best_fi and pct(best_fi[1][1]), ".1f"), fmt(ratio, ".3f"),
                fmt(seed and seed[0] * 1e3, ".1f"), fmt(seed and pct(seed[1]), ".1f")]
            out.append(Line(key[:3], cells, ratio, impl, pct(gbps),
                            best_fi and pct(best_fi[1][1]), seed and pct(seed[1])))
    return out, multi


def section_order(section):
    """Sections (q dtype, K/V dtype, q_len) by q dtype, K/V of q's dtype first, then q_len."""
    dtype, kv, q_len = section
    return DTYPE_ORDER.get(dtype, 9), kv != dtype, kv, q_len


MLA_HEAD = ["B,H,ctx,BS", "impl", "pagedattn us", "%", "FlashInfer us", "plain us", "path", "%",
            "ratio", "ratio plain"]


def mla_sections(rows, ceiling):
    """The MLA rows, one markdown section per (q dtype, latent dtype, q_len): pagedattn against
    FlashInfer's fastest path by graph replay, whose plain-call time stands beside it."""
    pct = lambda g: fmt(100 * g / ceiling if ceiling else None, ".1f")  # noqa: E731
    sections = OrderedDict()
    for key, impls in rows["mla_ours"].items():
        fi = {impl: med(s) for impl, s in rows["mla_fi"].get(key, {}).items()}
        best = min(fi.items(), key=lambda kv: kv[1][0]) if fi else None
        for name, samples in impls.items():
            ms, gbps = med(samples)
            ratio = ms / best[1][0] if best else None
            ratio_plain = ms / best[1][2] if best else None
            cells = [",".join(map(str, key[3] + (key[4],))), name, fmt(ms * 1e3, ".1f"),
                     pct(gbps), fmt(best and best[1][0] * 1e3, ".1f"),
                     fmt(best and best[1][2] * 1e3, ".1f"), best[0] if best else "-",
                     pct(best[1][1]) if best else "-", fmt(ratio, ".3f"),
                     fmt(ratio_plain, ".3f")]
            sections.setdefault(key[:3], []).append((cells, ratio))
    lines = []
    for (dtype, kv, q_len), group in sorted(sections.items(), key=lambda s: section_order(s[0])):
        lines += [f"## MLA: q {dtype}, latent cache {kv}, q_len {q_len}", "",
                  "| " + " | ".join(MLA_HEAD) + " |", "|" + "---|" * len(MLA_HEAD)]
        lines += ["| " + " | ".join(cells) + " |" for cells, _ in group]
        ratios = [r for _, r in group if r is not None]
        if ratios:
            lines += ["", f"Ratio {min(ratios):.3f} to {max(ratios):.3f}, median "
                      f"{statistics.median(ratios):.3f}, over {len(ratios)} row(s)."]
        lines.append("")
    if lines:
        lines = ["MLA decode (DeepSeek's absorbed form, kv_lora_rank 512 + rope 64): pagedattn's "
                 "time and FlashInfer's are CUDA-graph replays (FlashInfer's fastest path, fa2 or "
                 "fa3, its plain calls beside it); "
                 "ratio = pagedattn / FlashInfer's graph replay, ratio plain = pagedattn / its "
                 "plain calls; % counts each request's latent rows once.", ""] + lines
    return lines, sum(len(impls) for impls in rows["mla_ours"].values())


def markdown(rows, ceiling, source, notes):
    lines_, multi = table_lines(rows, ceiling)
    head = ["B,H,KV,D,ctx,BS"] + (["impl"] if multi else []) + [
        "pagedattn us", "%", "FlashInfer us", "path", "%", "ratio", "seed us", "%"]
    lines = ["# pagedattn against FlashInfer and the seed kernels", ""]
    lines.append(f"Read ceiling: {ceiling:.0f} GB/s ({source})." if ceiling else
                 "Read ceiling: not found (no % column).")
    lines += ["Times are CUDA-graph replays, median, in microseconds; % is of the read ceiling; "
              "ratio = pagedattn / FlashInfer's fastest path (below 1: pagedattn faster); seed = "
              "the best of its split kernels (bf16, q_len 1).", ""]
    sections = OrderedDict()
    for line in lines_:
        sections.setdefault(line.section, []).append(line)
    for (dtype, kv, q_len), group in sorted(sections.items(), key=lambda s: section_order(s[0])):
        lines += [f"## q {dtype}, K/V {kv}, q_len {q_len}", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(line.cells) + " |" for line in group]
        ratios = [line.ratio for line in group if line.ratio is not None]
        if ratios:
            lines += ["", f"Ratio {min(ratios):.3f} to {max(ratios):.3f}, median "
                      f"{statistics.median(ratios):.3f}, over {len(ratios)} row(s)."]
        lines.append("")
    mla, mla_rows = mla_sections(rows, ceiling)
    lines += mla
    if not lines_ and not mla_rows:
        lines += ["No pagedattn rows found.", ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n", lines_, mla_rows


def plot(table, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not importable: no plot"
    one = [t for t in table if t.section == ("bf16", "bf16", 1) and t.pct_ours is not None]
    if any(t.pct_fi is not None for t in one):
        one = [t for t in one if t.pct_fi is not None]  # the shapes FlashInfer ran
    if not one:
        return "no bf16 one-token rows with a read ceiling: no plot"
    several = len({t.impl for t in one}) > 1
    labels = [t.cells[0] + ("\n" + t.impl if several else "") for t in one]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(one)), 5))
    width = 0.27
    for i, (name, col) in enumerate((("pagedattn", "pct_ours"), ("FlashInfer fastest", "pct_fi"),
                                     ("seed", "pct_seed"))):
        xs = [j + (i - 1) * width for j in range(len(one))]
        ax.bar(xs, [getattr(t, col) or 0 for t in one], width, label=name)
    ax.set_xticks(range(len(one)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("% of the read ceiling")
    ax.set_ylim(0, 100)
    ax.set_title("Decode, bf16, one token: % of the read ceiling (B,H,KV,D,ctx,BS; one job)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return f"wrote {png}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="CSV files or folders")
    ap.add_argument("--ceiling", type=float, help="read ceiling in GB/s (default: from the logs)")
    ap.add_argument("--md", help="write the table here (default: stdout)")
    ap.add_argument("--png", help="plot %% of the ceiling, one-token rows (needs matplotlib)")
    a = ap.parse_args()
    csvs, texts = expand(a.paths)
    rows = {k: defaultdict(lambda: defaultdict(list))
            for k in ("ours", "fi", "seed", "mla_ours", "mla_fi")}
    rows["implied"] = []  # read ceilings implied by pagedattn rows (gbps / pct_read_bw)
    notes = []
    for p in csvs:
        try:
            read_csv(p, rows, notes)
        except OSError as e:
            notes.append(f"{p}: {e}")
    ceiling, source = (a.ceiling, "given") if a.ceiling else find_ceiling(texts)
    if not ceiling and rows["implied"]:
        ceiling, source = statistics.median(rows["implied"]), "median of pagedattn-bench's rows"
    text, table, mla_rows = markdown(rows, ceiling, source, notes)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.png:
        print(plot(table, a.png), file=sys.stderr)
    return 0 if table or mla_rows else 1


if __name__ == "__main__":
    sys.exit(main())
