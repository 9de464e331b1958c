#!/usr/bin/env bash
# One device call: install the carried wheels and Graft's distributions (the core and the
# plugins named in $PLUGINS, default all), then run each STEP ("name:seconds:command") with its
# own time limit, one after another; results go to $R = $OUT/results (each command's --out) and
# $OUT/log.txt, packed as $OUT/results.tgz. A step that fails or runs out of time is recorded
# and the next one runs.
#
#   PLUGINS="offload" bash bench/gpu/run.sh "rl:300:python3 bench/rl_throughput.py --out \$R/rl.json" ...
source "$(dirname "$0")/prelude.sh"
python3 -m pip install -q --no-deps --no-build-isolation -e core || exit 1
for plugin in ${PLUGINS:-$(ls plugins)}; do
  python3 -m pip install -q --no-deps --no-build-isolation -e "plugins/$plugin" || echo "plugin $plugin: install failed"
done
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
python3 -m graft plugins --json | python3 -c "import json,sys; print([(p['name'], p['status']) for p in json.load(sys.stdin)])"
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; command=${rest#*:}
  echo "=== $name (limit ${limit}s, at $(( $(date +%s) - started ))s): $command"
  t0=$(date +%s)
  R=$R timeout --signal=INT --kill-after=20 "$limit" bash -c "$command"
  echo "=== $name: exit $? after $(( $(date +%s) - t0 ))s"
done
tar czf "$OUT/results.tgz" -C "$R" .
echo "=== total $(( $(date +%s) - started ))s"
