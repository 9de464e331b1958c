"""``graft export --ckpt DIR --out HF_DIR [--dtype bf16] [--format NAME]``: a Graft checkpoint
as a HF model, or in a plugin's format (``graft_export_formats``: graft-lora's ``adapter``)."""

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
    parser.add_argument("--out", required=True, metavar="HF_DIR",
                        help="output directory: new, empty, or an export Graft wrote (replaced "
                             "whole)")
    parser.add_argument("--force", action="store_true",
                        help="replace HF_DIR even when it holds files Graft did not write (never "
                             "a folder holding the checkpoint, the run or the working directory)")
    parser.add_argument("--dtype", default="auto", choices=sorted(DTYPE_NAMES),
                        help="exported dtype (default: the model config's)")
    parser.add_argument("--format", default="hf", metavar="NAME",
                        help="hf (default: a Hugging Face model directory) or a plugin's "
                             "format (graft-lora: adapter, a PEFT adapter directory)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert and report."""
    from pathlib import Path

    from graft.checkpoint.manifest import verify_files
    from graft.checkpoint.reader import resolve_checkpoint, run_dir_of
    from graft.export.hf import damaged_advice, export_checkpoint_to_hf
    from graft.export.rebuilt import HF_FORMAT, export_rebuilt
    from graft.output_dirs import check_output_dir

    ckpt = resolve_checkpoint(args.ckpt)
    hint = "choose a new or empty folder, or pass --force to replace it"
    if args.format != HF_FORMAT:
        protected = {"the checkpoint": ckpt,
                     **({"the run directory": run} if (run := run_dir_of(ckpt)) else {})}
        check_output_dir(Path(args.out), protected=protected, force=args.force, label="--out",
                         hint=hint)
        verify_files(ckpt, checksums=False, advice=damaged_advice(ckpt))
        export_rebuilt(ckpt, Path(args.out), fmt=args.format, dtype_name=DTYPE_NAMES[args.dtype],
                       protected=protected, force=args.force)
        print(f"exported {ckpt} to {args.out} ({args.format})")
        return 0
    count = export_checkpoint_to_hf(ckpt, Path(args.out), dtype_name=DTYPE_NAMES[args.dtype],
                                    force=args.force, label="--out", hint=hint)
    print(f"exported {count} tensors from {ckpt} to {args.out}")
    return 0
