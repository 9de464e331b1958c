#!/usr/bin/env bash
# One device call comparing two trees of Graft on the same GPU: BEFORE (a `git archive` of an
# older commit, unpacked under build/ and carried) and AFTER (this checkout by default, or another
# carried archive). Each tree is installed with its core and every plugin in a virtual
# environment of its own over the image's torch, then each STEP ("name:seconds:arguments") runs once per tree, alternating before/after, from the tree's
# own folder: `python bench/<arguments>` with $R/<name>_<tree>.json as --out.
#
#   git archive 0cb6758 core plugins bench | tar -x -C build/trees/before   # here, then carry it
#   BEFORE=build/trees/before bash bench/gpu/before_after.sh \
#     "rl:240:rl_throughput.py --variants fused-rows exact --no-sft --steps 6"
source "$(dirname "$0")/prelude.sh"
HERE=$(cd "${AFTER:-.}" && pwd)
BEFORE=$(cd "${BEFORE:?set BEFORE to the older tree}" && pwd)

install_tree() {  # tree folder, venv folder
  # An image without ensurepip gets a venv without pip, filled by the image's pip (--python).
  python3 -m venv --system-site-packages "$2" 2>/dev/null \
    || python3 -m venv --system-site-packages --without-pip "$2" || return 1
  pip_in() { if [ -x "$2/bin/pip" ]; then "$2/bin/pip" "${@:3}"; else python3 -m pip --python "$2/bin/python" "${@:3}"; fi; }
  pip_in "$1" "$2" install -q --no-deps --no-build-isolation -e "$1/core" || return 1
  for plugin in "$1"/plugins/*/; do
    pip_in "$1" "$2" install -q --no-deps --no-build-isolation -e "$plugin" || echo "$plugin: install failed"
  done
  (cd /tmp && "$2/bin/python" -m graft plugins --json | "$2/bin/python" -c \
    "import json,sys; print('$1', [(p['name'], p['status']) for p in json.load(sys.stdin)])")
}
install_tree "$BEFORE" /tmp/venv-before || exit 1
install_tree "$HERE" /tmp/venv-after || exit 1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; arguments=${rest#*:}
  for tree in before after; do
    folder=$BEFORE; [ "$tree" = after ] && folder=$HERE
    echo "=== ${name}_$tree (limit ${limit}s, at $(( $(date +%s) - started ))s): $arguments"
    t0=$(date +%s)
    (cd "$folder" && timeout --signal=INT --kill-after=20 "$limit" \
      "/tmp/venv-$tree/bin/python" bench/$arguments --out "$R/${name}_$tree.json")
    echo "=== ${name}_$tree: exit $? after $(( $(date +%s) - t0 ))s"
  done
done
echo "=== total $(( $(date +%s) - started ))s"
