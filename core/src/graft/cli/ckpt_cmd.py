"""``graft ckpt inspect|verify DIR``: look into a checkpoint without loading a model."""

from __future__ import annotations

import argparse
import json
from typing import Any

# Every form `graft.checkpoint.reader.resolve_checkpoint` accepts (also used by `graft export`).
CKPT_HELP = ("a checkpoint: RUN_DIR/checkpoints/step_<N>, or RUN_DIR/checkpoints/latest, "
             "RUN_DIR/checkpoints or RUN_DIR for the latest one")


def add_parser(subparsers: Any) -> None:
    """Register ``graft ckpt inspect DIR [--json] [--config]`` and ``graft ckpt verify DIR``."""
    parser = subparsers.add_parser("ckpt", help="inspect or verify a checkpoint")
    commands = parser.add_subparsers(dest="ckpt_command", metavar="ACTION", required=True)
    inspect = commands.add_parser("inspect", help="step, world size, size on disk, parameters, "
                                                  "parameters without optimizer state")
    inspect.add_argument("path", metavar="DIR", help=CKPT_HELP)
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.add_argument("--config", action="store_true", help="also print the saved config")
    inspect.set_defaults(run=run_inspect)
    verify = commands.add_parser("verify", help="check every file (size, SHA-256) and read "
                                                "every tensor")
    verify.add_argument("path", metavar="DIR", help=CKPT_HELP)
    verify.set_defaults(run=run_verify)


def run_inspect(args: argparse.Namespace) -> int:
    """Print the summary; a `CheckpointError` (exit 2) after it when files of the manifest
    are missing or have another size on disk."""
    from graft.checkpoint.reader import resolve_checkpoint, summarize, summary_dict
    from graft.errors import CheckpointError

    summary = summarize(resolve_checkpoint(args.path))
    if args.json:
        print(json.dumps(summary_dict(summary), indent=2))
    else:
        print_summary(summary, with_config=args.config)
    if summary.damaged_files:
        raise CheckpointError(f"checkpoint {summary.path} is damaged: "
                              f"{'; '.join(summary.damaged_files)}; `graft ckpt verify "
                              f"{summary.path}` checks every file; use another checkpoint")
    return 0


def print_summary(summary: Any, *, with_config: bool) -> None:
    """The human-readable ``graft ckpt inspect`` report of a `CheckpointSummary`."""
    print(f"checkpoint      {summary.path}")
    print(f"step            {summary.step}")
    print(f"world size      {summary.world_size} (saved by graft {summary.graft_version}, "
          f"{summary.saved_at})")
    files = f"{summary.num_files} file{'s' if summary.num_files != 1 else ''}"
    damaged = f", {len(summary.damaged_files)} damaged" if summary.damaged_files else ""
    print(f"size on disk    {summary.size_bytes / 2**20:.1f} MiB in {files}{damaged}")
    print(f"parameters      {summary.parameter_count:,} in {summary.num_tensors} tensors")
    missing = summary.params_without_optimizer_state
    if missing:  # frozen or never-updated parameters; nothing to say when every one has state
        print(f"optimizer state missing for {len(missing)} of {summary.num_tensors} tensors "
              f"({', '.join(missing)})")
    if with_config:
        print("\n" + summary.config_yaml, end="")


def run_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every file matches the manifest and every tensor reads back."""
    from graft.checkpoint.manifest import verify_files
    from graft.checkpoint.reader import load_tensors, resolve_checkpoint, summarize

    path = resolve_checkpoint(args.path)
    verify_files(path, checksums=True)
    summary = summarize(path)
    tensors = load_tensors(path, prefix="")
    print(f"ok: {path}: {summary.num_files} files match manifest.json, {len(tensors)} tensors "
          f"read ({summary.size_bytes / 2**20:.1f} MiB)")
    return 0
