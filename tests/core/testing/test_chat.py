"""graft.testing's local chat checkpoint: Qwen's template, and its tool-calling one."""

from __future__ import annotations

from pathlib import Path

from graft.testing import write_chat_checkpoint

CALL = {"type": "function", "function": {"name": "f", "arguments": {"x": "a"}}}
TOOL = {"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}


def test_the_tools_template_renders_tools_calls_and_results_and_else_as_qwens(
        tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(write_chat_checkpoint(tmp_path / "plain"))
    tools = AutoTokenizer.from_pretrained(write_chat_checkpoint(tmp_path / "tools", tools=True))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    assert tools.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        plain.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    called = chat[:2] + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                         {"role": "tool", "name": "f", "content": "1"}]
    text = tools.apply_chat_template(called, tools=[TOOL], tokenize=False,
                                     add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name": "f"' in text
    assert text.endswith('<|im_start|>assistant\n\n<tool_call>\n{"name": "f", "arguments": '
                         '{"x": "a"}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
                         '<tool_response>\n1\n</tool_response><|im_end|>\n'
                         '<|im_start|>assistant\n')
