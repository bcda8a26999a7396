"""A corpus with some families measured again: a committed corpus file, less its trials of the families a survey
re-measured, plus that survey's trials on the corpus's own matrices.

Used where a family's kernel changed after its corpus was tuned (csr_vector's narrow columns; merge_path, which
the corpus predates): ``bench/survey.sh`` measures a portfolio of those families on the corpus's matrices, and
this writes the corpus the selectors are trained from. Matrices the corpus does not hold are left out (measured
only in the survey's families, they would teach the selector that every other config is missing).

    python bench/merge_corpus.py bench/results/corpus/2026-11-24_NVIDIA-H100-80GB-HBM3-sm-90_corpus.jsonl.gz \\
        bench/results/corpus/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_survey-narrow.jsonl.gz --replace csr_vector \\
        --out /tmp/H100_corpus-narrow.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from db.store import Store  # noqa: E402
from tuner.select.corpus import export_corpus, import_corpus, read_corpus  # noqa: E402


def merge(base: Path, survey: Path, replace: list[str], out: Path) -> None:
    """Write ``out``: ``base`` without its trials of ``replace``, with ``survey``'s trials on ``base``'s matrices."""
    records = list(read_corpus(base))
    kept = [(k, r) for k, r in records if not (k == "trial" and r["kernel"] in replace)]
    known = {r["fingerprint"] for k, r in kept if k == "matrix"}
    added = [r for k, r in read_corpus(survey) if k == "trial" and r["fingerprint"] in known]
    with tempfile.TemporaryDirectory() as tmp:
        kept_file = Path(tmp) / "kept.jsonl.gz"
        header = kept[0][1]
        header["counts"] = {**header["counts"], "trials": sum(k == "trial" for k, _ in kept)}
        header["counts"].pop("per_dtype", None)
        with gzip.open(kept_file, "wt", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            f.writelines(json.dumps({k: r}) + "\n" for k, r in kept[1:])
        store = Store(Path(tmp) / "merge.db")
        import_corpus(store, kept_file)
        store.import_trials(added)
        report = export_corpus(store, out)
    print(f"{base.name}: {len(records) - len(kept)} trials of {replace} dropped, {len(added)} of the survey added; "
          f"{out}: {report.trials} trials of {report.matrices} matrices")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the corpus file")
    ap.add_argument("survey", type=Path, help="the survey's corpus file (bench/survey.sh)")
    ap.add_argument("--replace", nargs="+", required=True, help="families whose corpus trials are dropped")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    merge(args.base, args.survey, args.replace, args.out)


if __name__ == "__main__":
    main()
