#!/usr/bin/env bash
# Issue #7, the learned selector's corpus: tune the shared matrices (less the complex ones) and the generated
# `corpus` suite (228 matrices, 10 K to 50 M nonzeros, every kind; built on the workers) with tune-many on every
# GPU here, float64 then float32, under one time cap; then sync into a store, export the corpus file, train the
# selector for both dtypes (CV table + out-of-fold evaluation) and write the shipped selectors.
#
# Resumable: the optuna journal stays in .corpus/ (ignored, kept while the machine is warm); run again and done
# studies are passed by without building their matrices. On a fresh machine, put the last $OUT/journal.log.gz into
# .corpus/ here (carry .corpus to a device machine): the script starts from it.
#
# GPUs:         OUT=/tmp/out bash bench/corpus.sh   (the shared matrices in .mats/; .gpu/device-env.sh sourced if there)
# Try it here:  OUT=/tmp/corpus-out CORPUS_DEVICE=cpu-reference CORPUS_SUITE=corpus-smoke CORPUS_SECONDS=60 \
#               PY=.venv/bin/python bash bench/corpus.sh
# Knobs: CORPUS_SECONDS (400: tuning time for both dtypes together), CORPUS_TRIALS (24 a study, besides the
#        portfolio), CORPUS_ENQUEUE (a portfolio file, `tuner corpus portfolio`: measured in every study, e.g.
#        bench/results/corpus/portfolio.json), CORPUS_DTYPES ("float64 float32"), CORPUS_SHARED (1: the shared
#        matrices too), CORPUS_SUITE (corpus), CORPUS_TRAIN (1: train and ship the selectors here too).
# Back in $OUT: corpus.jsonl.gz (commit under bench/results/corpus/), models/spmv-selector_*.pkl.gz (copy into
# tuner/data/), journal.log.gz (to resume elsewhere), tune-many.log, train.log.
# CUPY_CACHE_DIR (default .corpus/cupy-cache, kept while the machine is warm) serves CuPy's own kernels only: CuPy
# never reads its disk cache for a RawModule with name_expressions (every family's), so each worker process
# compiles each family once per dtype (seconds), whatever the cache holds.
set -u
begin=$(date +%s)
device=${CORPUS_DEVICE:-gpu} suite=${CORPUS_SUITE:-corpus} seconds=${CORPUS_SECONDS:-400}
trials=${CORPUS_TRIALS:-24} dtypes=${CORPUS_DTYPES:-float64 float32}
: "${OUT:?set OUT to the folder for the results}"
if [ "$device" = gpu ]; then
  [ -f .gpu/device-env.sh ] && source .gpu/device-env.sh
  nvidia-smi -L
  workers=()
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  workers=(--workers 2)
fi
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 COLUMNS=160 SPMV_SHARED_MATRICES=$PWD/.mats
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.corpus/cupy-cache}
mkdir -p .corpus "$OUT/models" "$CUPY_CACHE_DIR"
$PY -c "import sklearn, optuna, numpy, scipy; print('versions: scikit-learn', sklearn.__version__, 'optuna',
optuna.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__)"
enqueue=()
if [ -n "${CORPUS_ENQUEUE:-}" ]; then  # the portfolio's configs come on top of the sampled ones
  n=$($PY -c "import sys; from tuner.select.portfolio import read_portfolio; print(len(read_portfolio(sys.argv[1])))" \
      "$CORPUS_ENQUEUE") || exit 1
  trials=$((trials + n)) enqueue=(--enqueue "$CORPUS_ENQUEUE")
  echo "portfolio $CORPUS_ENQUEUE: $n configs; $trials trials a study"
fi
journal=.corpus/journal.log db=.corpus/corpus.db
if [ ! -s $journal ] && [ -s $journal.gz ]; then
  gunzip -c $journal.gz > $journal && echo "resuming from the carried $journal.gz"
fi
sources=()
if [ "${CORPUS_SHARED:-1}" = 1 ] && [ -f .mats/MANIFEST.tsv ]; then  # real and integer/pattern ones: not complex
  awk -F'\t' -v dir="$PWD/.mats" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $c["field"] != "complex" { print dir "/" $c["file"] }' .mats/MANIFEST.tsv > .corpus/shared.txt
  sources=(.corpus/shared.txt)
  echo "shared matrices: $(wc -l < .corpus/shared.txt)"
fi

# -- tuning: each dtype first gets its share of the time, then what is left goes to whatever is unfinished ----------
deadline=$((begin + seconds))
set -- $dtypes
declare -A complete
pass=0
for dt in "$@" "$@"; do
  pass=$((pass + 1))
  [ "${complete[$dt]:-0}" = 1 ] && continue
  left=$((deadline - $(date +%s)))
  [ $left -ge 20 ] || { echo "time cap reached before $dt (pass $pass)"; break; }
  share=$left
  [ $pass -lt $# ] && share=$((left / ($# - pass + 1)))  # first pass: an equal share for each dtype still to come
  echo "== tune-many $dt: --time-limit $share s (pass $pass, $(( $(date +%s) - begin )) s in)"
  s=$(date +%s)
  timeout --kill-after=30 $((share + 60)) $PY -m tuner tune-many "${sources[@]}" --suite "$suite" --storage $journal \
    --trials-per-matrix "$trials" --dtype "$dt" --device "$device" "${workers[@]}" "${enqueue[@]}" \
    --time-limit "$share" \
    > .corpus/tune-many-$dt-$pass.log 2>&1
  rc=$?
  cat .corpus/tune-many-$dt-$pass.log >> "$OUT/tune-many.log"
  grep -v "━" .corpus/tune-many-$dt-$pass.log | grep -v "^worker [0-9]:" | tail -n 16
  grep "^worker [0-9]:" .corpus/tune-many-$dt-$pass.log | tail -n 5
  echo "tune-many $dt: rc $rc in $(( $(date +%s) - s )) s"
  [ $rc = 0 ] && complete[$dt]=1
done
echo "== tuning done at $(( $(date +%s) - begin )) s; complete: ${!complete[*]}"

# -- the store, the corpus file, the selectors ------------------------------------------------------------------------
$PY -m tuner sync --storage $journal --db $db 2>&1 | tail -n 3
$PY -m tuner corpus export "$OUT/corpus.jsonl.gz" --db $db 2>&1 | tail -n 2
device_id=$($PY -c "import sys; from db.store import Store; s = Store(sys.argv[1]); print(s.devices()[0]['id'])" $db)
for dt in $( [ "${CORPUS_TRAIN:-1}" = 1 ] && echo $dtypes ); do
  echo "== train $dt on $device_id ($(( $(date +%s) - begin )) s in)"
  $PY -m tuner train --db $db --device "$device_id" --dtype "$dt" --ship --ship-dir "$OUT/models" 2>&1 \
    | tee -a "$OUT/train.log"
done
gzip -c $journal > "$OUT/journal.log.gz"
ls -la "$OUT" "$OUT/models"
$PY - $db <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for dt, n, m, ok in c.execute("select dtype, count(*), count(distinct fingerprint), sum(state = 'ok') from trials "
                              "group by dtype"):
    print(f"{dt}: {n} trials ({ok} ok) on {m} matrices")
for dt, k, n in c.execute("select dtype, kernel, count(*) from best group by dtype, kernel order by dtype, 3 desc"):
    print(f"  best {dt} {k}: {n}")
PY
echo "== corpus.sh done in $(( $(date +%s) - begin )) s"
