"""Two source trees on the unseen benchmark (bench/unseen.py), archived and run alike, and their runs compared.

A change to what ``plan()`` spends on the host moves it by tens of microseconds, while the GPU machines' hosts
move whole plans by 20-50 % between runs: only the same machine, the same matrices and runs that alternate
(new, base, base, new) tell such a change apart. Both trees must also run the same way: an A/B that ran one
tree from the checkout and the other from an archived copy put the checkout's matrix step 150-300 us higher on
every matrix, in both runs of each (stop 60, ``bench/results/2026-11-28_predict-readback-60.txt``). So each tree
is archived (``archive``, here, where git is), carried to the GPU machine, and run there from its own folder
with the same environment (``run``); ``compare`` reads the runs' result files.

    python bench/ab_unseen.py archive 9e0761a .gpu/ab/base       # a commit's tree
    python bench/ab_unseen.py archive WORKTREE .gpu/ab/new       # the working tree, changes not committed too
    python bench/ab_unseen.py run .gpu/ab/new .gpu/ab/base --out $OUT --cpu 3 -- --only rgg,kkt --effort predict
    python bench/ab_unseen.py compare $OUT/*_unseen-ab-*.json.gz --base base   # steps' medians; per matrix: new / base
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.jsonfile import read_json  # noqa: E402

TREE = ("common", "db", "kernels", "tuner", "bench/unseen*.py")
"""What a tree needs to run bench/unseen.py: the packages it imports and the benchmark itself, with its matrices
(``unseen_matrices.py``, a tree after stop 74; git's pathspec, so an older tree without it archives too). The
shipped selectors are the checkout's, ``$SPMV_TUNER_MODELS``, so that both trees rank with the same ones."""
WORKTREE = "WORKTREE"
ORDER = (0, 1, 1, 0)
"""Runs of the first tree (0) and the second (1): each pair alternates, so a drift of the host between runs
falls on both alike."""
LABEL = re.compile(r"_unseen-ab[^-]*-(?P<tree>.+)-(?P<run>\d+)\.json(\.gz)?$")


def archive(rev: str, dest: Path) -> None:
    """Write :data:`TREE` of ``rev`` (a commit, or :data:`WORKTREE`: the files git tracks or would, as they are
    now) into ``dest``, which must not exist, without the shipped selectors' data."""
    if dest.exists():
        raise SystemExit(f"{dest} exists: archive into a new folder")
    dest.mkdir(parents=True)
    if rev == WORKTREE:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *TREE], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.split()
        files = [f for f in listed if (REPO / f).is_file() and not f.startswith("tuner/data/")]
        for f in files:
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    else:
        got = subprocess.run(["git", "archive", rev, *TREE], cwd=REPO, capture_output=True)
        if got.returncode:
            dest.rmdir()
            raise SystemExit(f"git archive {rev}: {got.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(dest), "--exclude=tuner/data"], input=got.stdout, check=True)
        files = [p for p in dest.rglob("*") if p.is_file()]
    print(f"{dest}: {len(files)} files of {rev}")


def run(trees: list[Path], out: Path, args: list[str], cpu: int | None = None) -> None:
    """bench/unseen.py from each tree's own folder, in :data:`ORDER`, each run labelled ``ab-<tree>-<n>``, with
    the same environment: the tree first on the path, this checkout's shipped selectors, the tree's name as the
    commit (``SPMV_GIT_COMMIT``), pinned to core ``cpu`` where given."""
    if len(trees) != 2:
        raise SystemExit("run takes two trees")
    models = os.environ.get("SPMV_TUNER_MODELS", str(REPO / "tuner" / "data"))
    count: dict[int, int] = defaultdict(int)
    for which in ORDER:
        tree = trees[which].resolve()
        count[which] += 1
        env = {**os.environ, "SPMV_TUNER_MODELS": models, "SPMV_GIT_COMMIT": tree.name,
               "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
        command = [sys.executable, "bench/unseen.py", *args, "--label", f"ab-{tree.name}-{count[which]}",
                   "--out", str(out.resolve())]
        if cpu is not None:
            command = ["taskset", "-c", str(cpu), *command]
        print(f"== {tree.name} run {count[which]}", flush=True)
        if subprocess.run(command, cwd=tree, env=env).returncode:
            raise SystemExit(f"bench/unseen.py failed in {tree} (run {count[which]}): the runs after it were not made")


def compare(files: list[Path], base: str | None = None) -> list[str]:
    """Per tree, effort and dtype: the median over matrices of each run's plan steps and of the plan's seconds
    beyond the features; per matrix, each tree's median over its runs of those seconds, and the geometric mean
    over matrices of the other tree's over ``base``'s (default: the tree whose files sort first)."""
    runs: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    for path in sorted(files):
        found = LABEL.search(path.name)
        if found is None:
            raise SystemExit(f"{path.name}: not a run of `ab_unseen.py run` (…_unseen-ab-<tree>-<n>.json.gz)")
        runs[found["tree"]].append(read_json(path)["rows"])
    if len(runs) != 2:
        raise SystemExit(f"compare takes the runs of two trees, got {sorted(runs) or 'none'}")
    if base is not None and base not in runs:
        raise SystemExit(f"no runs of {base!r}: the trees are {sorted(runs)}")
    lines = []
    trees = sorted(runs, key=lambda t: t != base) if base is not None else list(runs)
    cells = sorted({(r["effort"], r["dtype"]) for rows in runs[trees[0]] for r in rows})
    for effort, dtype in cells:
        beyond: dict[str, dict[str, list[float]]] = {}
        for tree in trees:
            beyond[tree] = defaultdict(list)
            for n, rows in enumerate(runs[tree], 1):
                mine = [r for r in rows if r["effort"] == effort and r["dtype"] == dtype]
                steps = sorted({k for r in mine for k in r["plan_steps_s"]})
                medians = {k: np.median([r["plan_steps_s"].get(k, 0.0) for r in mine]) * 1e6 for k in steps}
                for r in mine:
                    beyond[tree][r["matrix"]].append(r["plan_s"] - r["features_s"])
                spent = np.median([r["plan_s"] - r["features_s"] for r in mine]) * 1e6
                lines.append(f"{effort} {dtype} {tree} run {n}: "
                             + ", ".join(f"{k} {v:.0f}" for k, v in medians.items())
                             + f" us; beyond the features {spent:.0f} us")
        shared = sorted(set(beyond[trees[0]]) & set(beyond[trees[1]]))
        ratios = [np.median(beyond[trees[1]][m]) / np.median(beyond[trees[0]][m]) for m in shared]
        for m, ratio in zip(shared, ratios, strict=True):
            lines.append(f"  {m:18s} " + " / ".join(f"{np.median(beyond[t][m]) * 1e6:.0f}" for t in trees)
                         + f" us  {ratio:.3f}")
        if ratios:
            lines.append(f"{effort} {dtype}: {trees[1]} / {trees[0]} beyond the features, geomean over "
                         f"{len(ratios)} matrices {np.exp(np.mean(np.log(ratios))):.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # bench/unseen.py's arguments follow "--": split off before parsing (a remainder argument after the trees would
    # take --out and --cpu too)
    unseen = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("archive", help="a tree of a commit (or WORKTREE) into a new folder")
    a.add_argument("rev")
    a.add_argument("dest", type=Path)
    r = sub.add_parser("run", help="bench/unseen.py from two archived trees, alternately (on the GPU machine)",
                       epilog="-- then bench/unseen.py's arguments")
    r.add_argument("trees", nargs=2, type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--cpu", type=int, default=None, help="pin every run to this core")
    c = sub.add_parser("compare", help="the runs' result files, side by side")
    c.add_argument("files", nargs="+", type=Path)
    c.add_argument("--base", default=None, help="the tree the other is divided by (its folder's name)")
    args = ap.parse_args(argv)
    if args.command == "archive":
        archive(args.rev, args.dest)
    elif args.command == "run":
        run(args.trees, args.out, unseen, args.cpu)
    else:
        print("\n".join(compare(args.files, args.base)))


if __name__ == "__main__":
    main()
