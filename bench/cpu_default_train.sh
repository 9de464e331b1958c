#!/usr/bin/env bash
# Wall time of the default `graft train` (no plugins) on this machine, against another checkout's
# core (BASE_SRC, e.g. a worktree of an older commit: git worktree add /tmp/base <commit>).
# Each round runs: base (BASE_SRC first on PYTHONPATH), new (this checkout), always (this
# checkout with algorithm.old_logprobs=always). One line per run: wall seconds, the metrics'
# summed step and update seconds, the first step's and the last five steps' mean reward, load.
#
#   BASE_SRC=/tmp/base/core/src bash bench/cpu_default_train.sh 2 > bench/results/cpu_default_train.txt
set -eu
rounds=${1:-2}
export GRAFT_PLUGINS=
for round in $(seq 1 "$rounds"); do
  for variant in base new always; do
    dir=$(mktemp -d)/run
    case $variant in
      base) extra=""; pp=$BASE_SRC;;
      new) extra=""; pp="";;
      always) extra="algorithm.old_logprobs=always"; pp="";;
    esac
    start=$(date +%s.%N)
    PYTHONPATH=$pp python -m graft train trainer.run_dir="$dir" $extra > "$dir.log" 2>&1
    end=$(date +%s.%N)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    steps=$(python -c "import json; rows=[json.loads(l) for l in open('$dir/metrics.jsonl')]; print(round(sum(r['step_time_s'] for r in rows),1), round(sum(r['update_s'] for r in rows),1), rows[0]['reward_mean'], round(sum(r['reward_mean'] for r in rows[-5:])/5,3))")
    echo "$variant round$round wall=$(python -c "print(round($end-$start,1))") steps_s,update_s,reward0,last5=$steps load=$load"
  done
done
