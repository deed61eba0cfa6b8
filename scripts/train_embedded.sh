#!/usr/bin/env bash
# Retrain fastspec's embedded default models: fastspec/data/{target,draft,dflash}.npz.
#
# Needs PyTorch (pip install torch; the CPU wheel is enough). Every step runs on one thread and
# is bounded by wall-clock minutes (--minutes: the learning-rate schedule follows the elapsed
# fraction of the budget, so a step ends on time even on a shared machine; its log records the
# number of steps reached).
#
# This is the recipe that produced the shipped weights (docs/MODELS.md, "Reproduce"), written
# as resumable phases: each phase starts from the previous one's .npz (--init). The shipped
# target's phase 1 was an interrupted run of another schedule; see docs/MODELS.md.
#
# Usage: bash scripts/train_embedded.sh [outdir] [workdir]
# Total about 7.4 hours on one core (the draft and DFlash runs of step 4 can share a second core).
set -euo pipefail
OUT=${1:-fastspec/data}
WORK=${2:-/tmp/fastspec-train}
PY=${PYTHON:-python}
mkdir -p "$OUT" "$WORK"

# 1. target: 4 x 256 byte LM, ~75 min (10 + 65).
$PY -m fastspec.training target --out "$WORK/target_phase1.npz" --seed 0 --threads 1 \
    --dim 256 --layers 4 --heads 4 --kv-heads 2 --seq 512 --batch 16 \
    --lr 2e-3 --warmup 150 --minutes 10 2>&1 | tee "$WORK/target_phase1.log"
$PY -m fastspec.training target --init "$WORK/target_phase1.npz" --data-seed 1 \
    --out "$OUT/target.npz" --seed 0 --threads 1 \
    --dim 256 --layers 4 --heads 4 --kv-heads 2 --seq 512 --batch 16 \
    --lr 2e-3 --warmup 30 --minutes 65 2>&1 | tee "$WORK/target.log"

# 2. draft: 1 x 256, distilled from the target (KL 0.8 + corpus CE 0.2), 30 + 13 min.
#    (The shipped draft's phase 1 distilled from a mid-training target checkpoint.)
$PY -m fastspec.training draft --target "$OUT/target.npz" --out "$WORK/draft_phase1.npz" \
    --seed 0 --threads 1 --dim 256 --layers 1 --heads 4 --kv-heads 2 --seq 512 --batch 16 \
    --lr 3e-3 --warmup 50 --init-embed --minutes 30 --eval-every 200 \
    2>&1 | tee "$WORK/draft_phase1.log"
$PY -m fastspec.training draft --target "$OUT/target.npz" --init "$WORK/draft_phase1.npz" \
    --data-seed 1 --out "$OUT/draft.npz" --seed 0 --threads 1 --dim 256 --layers 1 \
    --heads 4 --kv-heads 2 --seq 512 --batch 16 --lr 1e-3 --warmup 20 --minutes 13 \
    --eval-every 200 --fp32-copy "$WORK/draft_fp32.npz" 2>&1 | tee "$WORK/draft.log"

# 3. DFlash: 2 layers, block 8, taps [1, 3], on the target's own greedy continuations,
#    13 + 23 + 11 min. (The shipped drafter's phase 1 used a late, not final, target checkpoint.)
$PY -m fastspec.training dflash --target "$OUT/target.npz" --out "$WORK/dflash_phase1.npz" \
    --seed 0 --threads 1 --layers 2 --block-size 8 --tap-layers 1 3 --seq 256 --batch 8 \
    --anchors 16 --episodes 192 --val-episodes 32 --eval-rows 32 --final-eval-rows 32 \
    --gen-batch 64 --eval-every 100 --lr 2e-3 --warmup 50 --minutes 13 \
    --episodes-cache "$WORK/episodes_phase1.npz" 2>&1 | tee "$WORK/dflash_phase1.log"
$PY -m fastspec.training dflash --target "$OUT/target.npz" --init "$WORK/dflash_phase1.npz" \
    --out "$WORK/dflash_phase2.npz" --seed 1 --threads 1 --layers 2 --block-size 8 --tap-layers 1 3 \
    --seq 256 --batch 8 --anchors 16 --episodes 256 --val-episodes 32 --eval-rows 32 \
    --final-eval-rows 64 --gen-batch 64 --eval-every 300 --lr 1.5e-3 --warmup 30 \
    --mismatch-frac 0.35 --minutes 23 --episodes-cache "$WORK/episodes_phase2.npz" \
    2>&1 | tee "$WORK/dflash_phase2.log"
$PY -m fastspec.training dflash --target "$OUT/target.npz" --init "$WORK/dflash_phase2.npz" \
    --out "$OUT/dflash.npz" --seed 2 --threads 1 --layers 2 --block-size 8 --tap-layers 1 3 \
    --seq 256 --batch 8 --anchors 16 --episodes 256 --val-episodes 32 --eval-rows 32 \
    --final-eval-rows 64 --gen-batch 64 --eval-every 100000 --lr 1e-3 --warmup 20 \
    --mismatch-frac 0.35 --minutes 11 --episodes-cache "$WORK/episodes_phase2.npz" \
    --fp32-copy "$WORK/dflash_fp32.npz" 2>&1 | tee "$WORK/dflash.log"

# 4. Continue the target (phase 3, 78 min), then re-distil the draft and re-tune DFlash against
#    it (27 min each, in parallel). DFlash: fresh episodes and "miss" anchors (--miss-frac:
#    half of each episode row's anchors moved to where the drafter's own block first misses,
#    the round starts of greedy decoding).
$PY -m fastspec.training target --init "$OUT/target.npz" --data-seed 2 --out "$WORK/target_phase3.npz" \
    --seed 0 --threads 1 --dim 256 --layers 4 --heads 4 --kv-heads 2 --seq 512 --batch 16 \
    --lr 1e-3 --warmup 30 --minutes 78 --eval-every 250 2>&1 | tee "$WORK/target_phase3.log"
cp "$WORK/target_phase3.npz" "$OUT/target.npz"
$PY -m fastspec.training draft --target "$OUT/target.npz" --init "$OUT/draft.npz" --data-seed 3 \
    --out "$WORK/draft_phase3.npz" --seed 0 --threads 1 --dim 256 --layers 1 --heads 4 \
    --kv-heads 2 --seq 512 --batch 16 --lr 1e-3 --warmup 20 --minutes 27 --eval-every 300 \
    2>&1 | tee "$WORK/draft_phase3.log"
$PY -m fastspec.training dflash --target "$OUT/target.npz" --init "$OUT/dflash.npz" \
    --out "$WORK/dflash_phase4.npz" --seed 3 --threads 1 --layers 2 --block-size 8 --tap-layers 1 3 \
    --seq 256 --batch 8 --anchors 16 --episodes 256 --val-episodes 32 --eval-rows 32 \
    --final-eval-rows 64 --gen-batch 64 --eval-every 500 --lr 1.5e-3 --warmup 30 \
    --mismatch-frac 0.3 --miss-frac 0.5 --minutes 27 --episodes-cache "$WORK/episodes_phase4.npz" \
    2>&1 | tee "$WORK/dflash_phase4.log"
# 5-9. DFlash on fresh greedy episodes (phase 4 had overfitted its 256), each phase from the
#      previous one. Arguments: phase, episodes, threads, peak lr, minutes (seed = phase).
dflash_fresh() {
    local phase=$1 episodes=$2 threads=$3 lr=$4 minutes=$5
    $PY -m fastspec.training dflash --target "$OUT/target.npz" \
        --init "$WORK/dflash_phase$((phase - 1)).npz" --out "$WORK/dflash_phase$phase.npz" \
        --seed "$phase" --threads "$threads" --layers 2 --block-size 8 --tap-layers 1 3 \
        --seq 256 --batch 8 --anchors 16 --episodes "$episodes" --val-episodes 32 --eval-rows 32 \
        --final-eval-rows 64 --gen-batch 64 --eval-every 100000 --lr "$lr" --warmup 20 \
        --mismatch-frac 0.3 --miss-frac 0.5 --minutes "$minutes" \
        --episodes-cache "$WORK/episodes_phase$phase.npz" 2>&1 | tee "$WORK/dflash_phase$phase.log"
}
dflash_fresh 5 1536 1 8e-4 12
dflash_fresh 6 2560 2 6e-4 14   # 2 threads on an idle machine
dflash_fresh 7 4096 1 5e-4 35   # 7-9: one thread, the other core busy with other work
dflash_fresh 8 4096 1 4e-4 33
dflash_fresh 9 4096 1 3e-4 30
cp "$WORK/draft_phase3.npz" "$OUT/draft.npz"
cp "$WORK/dflash_phase9.npz" "$OUT/dflash.npz"
