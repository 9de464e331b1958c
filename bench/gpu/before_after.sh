#!/usr/bin/env bash
# One device call comparing two trees of Graft on the same GPU: BEFORE (a `git archive` of an
# older commit, unpacked under build/ and carried) and AFTER (this checkout by default, or another
# carried archive). Each tree's core and plugins are built into a folder of their own, put first
# on PYTHONPATH for that tree's runs (over the image's torch), then each STEP ("name:seconds:arguments") runs once per tree, alternating before/after, from the tree's
# own folder: `python bench/<arguments>` with $R/<name>_<tree>.json as --out.
#
#   git archive 0cb6758 core plugins bench | tar -x -C build/trees/before   # here, then carry it
#   BEFORE=build/trees/before bash bench/gpu/before_after.sh \
#     "rl:240:rl_throughput.py --variants fused-rows exact --no-sft --steps 6"
source "$(dirname "$0")/prelude.sh"
HERE=$(cd "${AFTER:-.}" && pwd)
BEFORE=$(cd "${BEFORE:?set BEFORE to the older tree}" && pwd)

install_tree() {  # tree folder, target folder: the core and every plugin, built, with their entry points
  python3 -m pip install -q --no-deps --no-build-isolation --target "$2" "$1/core" "$1"/plugins/*/ || return 1
  (cd /tmp && PYTHONPATH="$2:$PYTHONPATH" python3 -m graft plugins --json | python3 -c \
    "import json,sys; print('$1', [(p['name'], p['status']) for p in json.load(sys.stdin)])")
}
install_tree "$BEFORE" /tmp/tree-before || exit 1
install_tree "$HERE" /tmp/tree-after || exit 1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; arguments=${rest#*:}
  for tree in before after; do
    folder=$BEFORE; [ "$tree" = after ] && folder=$HERE
    echo "=== ${name}_$tree (limit ${limit}s, at $(( $(date +%s) - started ))s): $arguments"
    t0=$(date +%s)
    (cd "$folder" && PYTHONPATH="/tmp/tree-$tree:$PYTHONPATH" timeout --signal=INT --kill-after=20 \
      "$limit" python3 bench/$arguments --out "$R/${name}_$tree.json")
    echo "=== ${name}_$tree: exit $? after $(( $(date +%s) - t0 ))s"
  done
done
echo "=== total $(( $(date +%s) - started ))s"
