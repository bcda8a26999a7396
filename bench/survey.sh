#!/usr/bin/env bash
# A survey of a portfolio on the selector's corpus (the shared matrices, `corpus` and `corpus-more`) on this GPU, both
# dtypes, under a time cap; the trials exported as a corpus file to put in place of the committed corpus's
# (`tuner corpus replace BASE SURVEY OUT --family csr_vector`). Used to measure configs added after a corpus was
# tuned (narrow columns, merge_path): bench/results/corpus/2026-11-26_*_survey-narrow.jsonl.gz (380 matrices,
# 38 configs, both dtypes: 245-268 s a GPU).
#   OUT=/tmp/out PORTFOLIO=bench/results/corpus/portfolio-narrow.json SECONDS_CAP=400 bash bench/survey.sh
set -u
: "${OUT:?set OUT}" "${PORTFOLIO:?set PORTFOLIO}"
[ -f .gpu/device-env.sh ] && source .gpu/device-env.sh
PY=${PY:-python3}
mats=${SPMV_SHARED_MATRICES:-$PWD/.mats}
export PYTHONUNBUFFERED=1 COLUMNS=160 SPMV_SHARED_MATRICES=$mats
mkdir -p .corpus
awk -F'\t' -v dir="$mats" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  $c["field"] != "complex" { print dir "/" $c["file"] }' "$mats/MANIFEST.tsv" > .corpus/shared.txt
db=.corpus/survey.db
timeout --kill-after=30 "${SECONDS_CAP:-400}" $PY -m tuner corpus measure .corpus/shared.txt --suite corpus \
  --suite corpus-more --portfolio "$PORTFOLIO" --db $db --workers "${WORKERS:-12}" > .corpus/survey.log 2>&1
echo "survey rc $?"; grep -v "━" .corpus/survey.log | tail -n 8
$PY -m tuner corpus export "$OUT/survey.jsonl.gz" --db $db 2>&1 | tail -n 2
