"""Where plan()'s host time goes (issue #18's cost): each step's seconds and a cProfile of several plans.

On a GPU, for each unseen matrix chosen (``bench/unseen.py``'s generators) and each effort: one plan()
to compile, three timed (``ex.cost``: the matrix's checks, fingerprint, store lookup, features, ranking,
race, preparation), then a cProfile of five, each on a fresh store, the functions by cumulative and by
own time.

    python bench/profile_plan.py --only rgg,communities --effort predict race > profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import MATRICES  # noqa: E402

from db.store import Store  # noqa: E402
from tuner.execute.plan import EFFORTS, plan  # noqa: E402


def fresh() -> Store:
    """A store holding nothing: plan() then ranks (and races) as on a matrix it never saw."""
    return Store(Path(tempfile.mkdtemp()) / "store.db")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="rgg,communities", help="comma-separated matrix names of bench/unseen.py")
    ap.add_argument("--effort", nargs="+", default=["predict", "race"], choices=EFFORTS)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--dtype", default="float64")
    args = ap.parse_args()
    import cupyx.scipy.sparse as cusp

    warm = cusp.csr_matrix(MATRICES[0].make(0.01).astype(args.dtype))
    for effort in args.effort:  # imports, the selector's first load, the backend's probes
        plan(warm, effort=effort, db=fresh())
    for m in MATRICES:
        if m.name not in args.only.split(","):
            continue
        A = cusp.csr_matrix(m.make(args.scale).astype(args.dtype))
        for effort in args.effort:
            plan(A, effort=effort, db=fresh())  # compiles what this matrix runs
            for _ in range(3):
                ex = plan(A, effort=effort, db=fresh())
                steps = {k: round(v * 1e3, 3) for k, v in ex.cost.items()}
                print(f"{m.name} {effort} ms {steps} {ex.kernel}", flush=True)
            profile, stores = cProfile.Profile(), [fresh() for _ in range(5)]
            profile.enable()
            for store in stores:
                plan(A, effort=effort, db=store)
            profile.disable()
            for key, lines in (("cumulative", 45), ("tottime", 25)):
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats(key).print_stats(lines)
                print(f"== {m.name} {effort}, 5 plans, by {key}\n{text.getvalue()}", flush=True)


if __name__ == "__main__":
    main()
