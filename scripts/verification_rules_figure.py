"""The figure of bench/rules.py's JSON document: accepted drafts per step against K for each rule,
a panel per temperature, expected from p and q (lines) and measured (markers).

    python scripts/verification_rules_figure.py docs/verification_rules.json --out docs/verification_rules.png
"""
import argparse
import json
from pathlib import Path

from specdec_lab.bench.rules import figure
from specdec_lab.lab.static_figures import png


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc", help="the JSON document of python -m specdec_lab.bench.rules --out")
    ap.add_argument("--out", default="docs/verification_rules.png")
    args = ap.parse_args()
    doc = json.loads(Path(args.doc).read_text())
    Path(args.out).write_bytes(png(figure(doc), width=1100, height=420))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
