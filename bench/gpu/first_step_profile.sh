#!/usr/bin/env bash
# Where the time to the first step goes, with a warm compile cache: the default RL variant of
# bench/rl_throughput.py once to fill a compile cache folder, then again in a fresh process
# under cProfile; prints the functions with the most cumulative time and writes the profile.
#
#   bash bench/gpu/first_step_profile.sh $OUT/results     # one H200, about 2 minutes
set -eu
out=${1:?results folder}
cache=$(mktemp -d)/torch_compile
run() { python3 "$@" bench/rl_throughput.py --variants default --steps 1 --no-sft \
          --override "engine.compile_cache_dir=$cache"; }
run > /dev/null
run -m cProfile -o "$out/first_step.prof" > /dev/null
python3 - "$out/first_step.prof" <<'PY' | tee "$out/first_step_profile.txt"
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_stats(60)
PY
