# Sourced by the device-call scripts (run.sh, before_after.sh): environment for NCCL on the lent
# machines, results under $R = $OUT/results, everything printed also kept in $OUT/log.txt, and
# the carried wheels (.whl: hydra-core, omegaconf, antlr4) installed into /tmp/site on PYTHONPATH.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/results
mkdir -p "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
started=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/* || exit 1
export PYTHONPATH=/tmp/site
