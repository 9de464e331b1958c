"""The QAT precision map: which module of a DeepSeek-V4 decoder layer FP8 inference quantises,
and how. Data in one place, checked against the model at start-up (fail closed).

From the DeepSeek-V4 inference recipe (VeOmni PR #1089, vLLM's deepseek_v4 model): attention
projections and shared experts use FP8 E4M3 weights in 128x128 tiles with FP8 1x128 inputs; the
KV cache (sliding window and compressed entries) is FP8 in 1x64 tiles over the non-RoPE channels;
the lightning indexer's query and compressed keys are FP8 1x128 over the head; routed experts
have FP4 (1x32 groups, when the checkpoint's ``expert_dtype`` is ``fp4``) or FP8 tile weights
with FP8 1x128 inputs. Never quantised: the main attention's query (the output of ``q_b_proj``),
the compressors' projections, the indexer's ``weights_proj``, the MoE gate, the MoE output, the
hyper-connections (fp32), embeddings and head.

`resolve_targets` walks every decoder layer: every rule must find its module (of the right
kind), every linear layer must be covered by a rule (quantised or explicitly bf16), and every
quantised dimension must split into whole tiles; anything else is an error naming the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.errors import ConfigError, PluginError

if TYPE_CHECKING:
    import torch

# What a rule quantises.
WEIGHT_TILES = "fp8 weight, 128x128 tiles"
EXPERT_WEIGHTS = "expert weights: fp4 1x32 groups or fp8 128x128 tiles per expert"
INPUT_ROWS = "fp8 input, 1x128 tiles"
KV_NOPE = "fp8 output, 1x64 tiles on the non-RoPE channels"
INDEXER_QK = "fp8 indexer query and keys, 1x128 tiles"

TILE = 128
KV_TILE = 64
FP4_GROUP = 32

EVERY_LAYER = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
COMPRESSED = ("compressed_sparse_attention", "heavily_compressed_attention")
SPARSE = ("compressed_sparse_attention",)


@dataclass(frozen=True)
class Rule:
    """One module of a decoder layer (``path``) and what FP8 inference quantises in it.

    ``inner`` is the routed experts' second GEMM input (the gated activation). ``layer_types``:
    the attention layer types that have this module (the compressor exists in compressed layers,
    the indexer in sparse ones). A rule with nothing to quantise keeps its module in bf16.
    """

    path: str
    weight: str | None = None
    inputs: str | None = None
    output: str | None = None
    inner: str | None = None
    layer_types: tuple[str, ...] = EVERY_LAYER
    why: str = ""

    @property
    def quantized(self) -> bool:
        """True when the rule quantises anything."""
        return any((self.weight, self.inputs, self.output, self.inner))


PRECISION_MAP: tuple[Rule, ...] = (
    Rule("self_attn.q_a_proj", WEIGHT_TILES, INPUT_ROWS, why="wq_a"),
    Rule("self_attn.q_b_proj", WEIGHT_TILES, INPUT_ROWS,
         why="wq_b; its output, the main attention's query, stays bf16"),
    Rule("self_attn.kv_proj", WEIGHT_TILES, INPUT_ROWS, why="wkv"),
    Rule("self_attn.kv_norm", output=KV_NOPE, why="the sliding-window KV cache"),
    Rule("self_attn.o_a_proj", WEIGHT_TILES, INPUT_ROWS,
         why="wo_a (grouped: tiles within a group); its input is after the inverse RoPE"),
    Rule("self_attn.o_b_proj", WEIGHT_TILES, INPUT_ROWS, why="wo_b"),
    Rule("self_attn.compressor.kv_norm", output=KV_NOPE, layer_types=COMPRESSED,
         why="compressed KV cache entries"),
    Rule("self_attn.compressor.kv_proj", layer_types=COMPRESSED, why="compressor: bf16"),
    Rule("self_attn.compressor.gate_proj", layer_types=COMPRESSED, why="compressor: bf16"),
    Rule("self_attn.compressor.indexer.q_b_proj", WEIGHT_TILES, INPUT_ROWS, layer_types=SPARSE,
         why="indexer wq_b"),
    Rule("self_attn.compressor.indexer.scorer", inputs=INDEXER_QK, layer_types=SPARSE,
         why="FP8 indexer: query and compressed keys after RoPE"),
    Rule("self_attn.compressor.indexer.kv_proj", layer_types=SPARSE, why="compressor: bf16"),
    Rule("self_attn.compressor.indexer.gate_proj", layer_types=SPARSE, why="compressor: bf16"),
    Rule("self_attn.compressor.indexer.scorer.weights_proj", layer_types=SPARSE,
         why="indexer head weights: bf16"),
    Rule("mlp.gate", why="MoE gate: bf16 weights, fp32 scores"),
    Rule("mlp.experts", EXPERT_WEIGHTS, INPUT_ROWS, inner=INPUT_ROWS,
         why="routed experts; their output (the MoE output) stays bf16"),
    Rule("mlp.shared_experts.gate_proj", WEIGHT_TILES, INPUT_ROWS, why="shared expert w1"),
    Rule("mlp.shared_experts.up_proj", WEIGHT_TILES, INPUT_ROWS, why="shared expert w3"),
    Rule("mlp.shared_experts.down_proj", WEIGHT_TILES, INPUT_ROWS, why="shared expert w2"),
)


@dataclass(frozen=True)
class Target:
    """A rule resolved in one decoder layer: the module's full name and the module."""

    name: str
    module: torch.nn.Module
    rule: Rule


def resolve_targets(model: torch.nn.Module, blocks: Sequence[torch.nn.Module], *,
                    expert_dtype: str) -> list[Target]:
    """Every quantised module of ``model`` with its rule, checked against the model.

    ``blocks`` are the decoder layers in order; ``expert_dtype`` is ``fp4`` or ``fp8``. Raises
    `PluginError` when the map and the model disagree (a rule's module is missing or of another
    kind, a linear layer no rule covers) and `ConfigError` when a quantised dimension does not
    split into whole tiles.
    """
    names = {module: name for name, module in model.named_modules()}
    layer_types = list(model.config.layer_types)
    targets = []
    for index, block in enumerate(blocks):
        kind = layer_types[index]
        rules = [r for r in PRECISION_MAP if kind in r.layer_types]
        covered = set()
        for rule in rules:
            module = _find(block, rule, names[block])
            covered.add(module)
            if rule.quantized:
                target = Target(names[module], module, rule)
                check_tiles(target, model.config, expert_dtype)
                targets.append(target)
        uncovered = [names[m] for m in _linear_children(block) if m not in covered]
        if uncovered:
            raise PluginError(
                f"deepseek_v4 QAT: {', '.join(uncovered)} is not in the precision map "
                f"(graft_deepseek_v4/precision.py); this transformers version has modules the "
                f"map does not know. Add a rule saying whether FP8 inference quantises it, or set "
                f"features.deepseek_v4.qat=none")
    return targets


def _find(block: torch.nn.Module, rule: Rule, block_name: str) -> torch.nn.Module:
    try:
        module = block.get_submodule(rule.path)
    except AttributeError:
        raise PluginError(
            f"deepseek_v4 QAT: the precision map's target {rule.path!r} ({rule.why}) does not "
            f"exist in {block_name} ({type(block).__name__}); the transformers DeepSeek-V4 code "
            f"does not match the map (graft_deepseek_v4/precision.py). Use a transformers "
            f"version the plugin supports or set features.deepseek_v4.qat=none") from None
    expected_3d = rule.weight == EXPERT_WEIGHTS
    weights = [getattr(module, n, None) for n in (("gate_up_proj", "down_proj") if expected_3d
                                                  else ("weight",))]
    needs_weight = rule.weight is not None or not rule.quantized
    if needs_weight and not all(w is not None and w.dim() == (3 if expected_3d else 2)
                                for w in weights):
        raise PluginError(
            f"deepseek_v4 QAT: {block_name}.{rule.path} ({type(module).__name__}) is not the "
            f"{'stacked experts' if expected_3d else 'linear layer'} the precision map expects")
    return module


def _linear_children(module: torch.nn.Module) -> list[torch.nn.Module]:
    import torch

    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def check_tiles(target: Target, config: object, expert_dtype: str) -> None:
    """`ConfigError` unless every quantised dimension of ``target`` splits into whole tiles."""
    rule, module = target.rule, target.module
    checks: list[tuple[str, int, int]] = []
    if rule.weight == WEIGHT_TILES:
        rows, cols = module.weight.shape
        checks += [("weight rows", rows, TILE), ("weight columns", cols, TILE)]
    if rule.weight == EXPERT_WEIGHTS:
        _, up_rows, hidden = module.gate_up_proj.shape
        inner = module.down_proj.shape[-1]
        group = FP4_GROUP if expert_dtype == "fp4" else TILE
        checks += [("hidden size", hidden, group), ("expert intermediate size", inner, group),
                   ("expert intermediate size (input activations)", inner, TILE)]
        if expert_dtype == "fp8":
            checks += [("gate/up rows", up_rows // 2, TILE)]
    if rule.inputs == INPUT_ROWS and hasattr(module, "weight") and module.weight.dim() == 2:
        checks.append(("input features", module.weight.shape[1], TILE))
    if rule.inputs == INPUT_ROWS and rule.weight == EXPERT_WEIGHTS:
        checks.append(("hidden size (input activations)", module.gate_up_proj.shape[-1], TILE))
    if rule.output == KV_NOPE:
        width = module.weight.shape[0]
        checks.append(("non-RoPE KV channels", width - config.qk_rope_head_dim, KV_TILE))
    if rule.inputs == INDEXER_QK:
        checks.append(("indexer head dim", config.index_head_dim, TILE))
    for what, size, tile in checks:
        if size % tile:
            raise ConfigError(
                f"features.deepseek_v4.qat: {target.name} ({rule.why}): its {what} ({size}) is "
                f"not a multiple of the {tile}-wide quantisation tiles. DeepSeek-V4's FP8 recipe "
                f"needs 128x128 weight tiles, 1x128 activation tiles, 1x64 KV tiles and 1x32 "
                f"FP4 groups; use a model whose sizes are multiples of these or qat=none")
