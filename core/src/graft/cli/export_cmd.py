"""``graft export --ckpt DIR --out HF_DIR [--dtype bf16]``: a Graft checkpoint as a HF model."""

from __future__ import annotations

import argparse
from typing import Any

from graft.cli.ckpt_cmd import CKPT_HELP

DTYPE_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
               "fp32": "float32", "float32": "float32", "auto": "auto"}


def add_parser(subparsers: Any) -> None:
    """Register the ``export`` subcommand."""
    parser = subparsers.add_parser("export", help="convert a checkpoint into a HF directory",
                                   description="Write a Hugging Face model directory "
                                               "(safetensors, config, tokenizer) from a Graft "
                                               "checkpoint; from_pretrained loads it as is.")
    parser.add_argument("--ckpt", required=True, metavar="DIR", help=CKPT_HELP)
    parser.add_argument("--out", required=True, metavar="HF_DIR", help="output directory")
    parser.add_argument("--dtype", default="auto", choices=sorted(DTYPE_NAMES),
                        help="exported dtype (default: the model config's)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert and report."""
    from pathlib import Path

    from graft.checkpoint.reader import resolve_checkpoint
    from graft.export.hf import export_checkpoint_to_hf

    ckpt = resolve_checkpoint(args.ckpt)
    count = export_checkpoint_to_hf(ckpt, Path(args.out), dtype_name=DTYPE_NAMES[args.dtype])
    print(f"exported {count} tensors from {ckpt} to {args.out}")
    return 0
