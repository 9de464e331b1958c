"""SFT on chat data: TRL's SFT layouts read as they are, rendered through the chat template, the
loss on the assistant turns only (each through its end-of-turn token), checked against ids and
masks written out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import graft
from graft.config import DataConfig
from graft.data.dataset import load_text_samples, tokenize_sft
from graft.data.tokenizer import builtin_tokenizer
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.errors import DataError

# The built-in character tokenizer: <bos> 1, <eos> 2, then one id per character (ord - 28).
BOS, EOS, NL = 1, 2, 99
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + eos_token"
            " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")
CONVERSATION = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ok"},
                {"role": "assistant", "content": "no"}]
# <bos>s:be<eos>\nu:hi<eos>\na:yo<eos>\nu:ok<eos>\na:no<eos>\n
IDS = [BOS,
       87, 30, 70, 73, EOS, NL,  # s:be
       89, 30, 76, 77, EOS, NL,  # u:hi
       69, 30, 93, 83, EOS, NL,  # a:yo
       89, 30, 83, 79, EOS, NL,  # u:ok
       69, 30, 82, 83, EOS, NL]  # a:no
# Trained: each assistant turn's text and its <eos>; not its header, not the newline after.
TRAINED = [0,
           0, 0, 0, 0, 0, 0,
           0, 0, 0, 0, 0, 0,
           0, 0, 1, 1, 1, 0,
           0, 0, 0, 0, 0, 0,
           0, 0, 1, 1, 1, 0]


def trained_tokens(sample: TokenSample) -> list[int]:
    """1 for each input token the loss covers, as the engine's packed batch says (the label
    at position t is token t + 1)."""
    batch = build_micro_batch([sample], packs_sequences=True, pad_token_id=0)
    mask = batch.tensors["loss_mask"][0, :len(sample)].int().tolist()
    return [0, *mask[:-1]]


def write_jsonl(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def sft_samples(tmp_path: Path, *records: dict[str, Any], template: str = TEMPLATE,
                **keys: Any) -> list[TokenSample]:
    """The records through SFT's reading and tokenization with the character tokenizer."""
    (tmp_path / "chat.jinja").write_text(template)
    data = DataConfig(source="file", path=str(write_jsonl(tmp_path / "d.jsonl", *records)),
                      chat_template=str(tmp_path / "chat.jinja"), **keys)
    texts = load_text_samples(data, seed=0, require_response=True)
    return tokenize_sft(texts, builtin_tokenizer(), max_prompt_tokens=64,
                        max_response_tokens=64, chat_template=data.chat_template)


def test_a_multi_turn_conversation_trains_its_assistant_turns_only(tmp_path: Path) -> None:
    (sample,) = sft_samples(tmp_path, {"messages": CONVERSATION})
    assert list(sample.input_ids) == IDS
    assert trained_tokens(sample) == TRAINED


def test_trls_conversational_prompt_completion_trains_the_completion(tmp_path: Path) -> None:
    (whole, *later) = sft_samples(
        tmp_path, {"prompt": CONVERSATION[:2], "completion": CONVERSATION[2:]},
        {"prompt": CONVERSATION[:4], "completion": CONVERSATION[4:]},
        {"prompt": CONVERSATION[:3], "completion": CONVERSATION[3:]})
    assert list(whole.input_ids) == IDS and trained_tokens(whole) == TRAINED
    # The prompt's own assistant turn is context: only the completion's turn is trained (also
    # when the completion opens with a user turn).
    for sample in later:
        assert list(sample.input_ids) == IDS
        assert trained_tokens(sample) == [0] * 25 + TRAINED[25:]


def test_generation_markers_in_the_template_give_the_mask(tmp_path: Path) -> None:
    marked = ("{{ bos_token }}{% for m in messages %}{{ m['role'][0] + ':' }}"
              "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
              "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{{ eos_token + '\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")
    (sample,) = sft_samples(tmp_path, {"messages": CONVERSATION}, template=marked)
    assert list(sample.input_ids) == IDS
    # This template marks the text without the <eos>: its marks are followed as they are.
    assert trained_tokens(sample) == [0] * 15 + [1, 1] + [0] * 10 + [1, 1, 0, 0]


def test_qwens_template_trains_through_im_end_not_the_newline(chat_tokenizer: Any,
                                                              tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "qwen.jsonl", {"messages": [
        {"role": "user", "content": "Ada has 3 apples"},
        {"role": "assistant", "content": "The answer is 3"},
        {"role": "user", "content": "more"}, {"role": "assistant", "content": "42"}]})
    texts = load_text_samples(DataConfig(source="file", path=str(path)), seed=0,
                              require_response=True)
    (sample,) = tokenize_sft(texts, chat_tokenizer, max_prompt_tokens=64,
                             max_response_tokens=64)
    ids, trained = list(sample.input_ids), trained_tokens(sample)
    decode = chat_tokenizer.decode
    assert decode([i for i, t in zip(ids, trained, strict=True) if t]) == (
        "The answer is 3<|im_end|>42<|im_end|>")
    assert decode(ids[:sample.response_start]) == (
        "<|im_start|>user\nAda has 3 apples<|im_end|>\n<|im_start|>assistant\n")


def test_trls_standard_layouts(tmp_path: Path) -> None:
    text, pair, ours = sft_samples(tmp_path, {"text": "ab"}, {"prompt": "x", "completion": "y"},
                                   {"prompt": "x", "response": "y"})
    assert list(text.input_ids) == [BOS, 69, 70, EOS]  # language modeling: every token trained
    assert trained_tokens(text) == [0, 1, 1, 1]
    assert list(pair.input_ids) == list(ours.input_ids) == [BOS, 92, 93, EOS]
    assert trained_tokens(pair) == trained_tokens(ours) == [0, 0, 1, 1]


def test_the_layout_keys_are_settings(tmp_path: Path) -> None:
    (chat, text) = sft_samples(tmp_path, {"dialog": CONVERSATION}, {"body": "ab"},
                               messages_key="dialog", text_key="body")
    assert list(chat.input_ids) == IDS and trained_tokens(chat) == TRAINED
    assert list(text.input_ids) == [BOS, 69, 70, EOS]


@pytest.mark.parametrize(("record", "message"), [
    ({"messages": CONVERSATION[:2]}, r"'messages' has no assistant message to train on"),
    ({"prompt": CONVERSATION[:2], "completion": CONVERSATION[3:4]},
     r"'completion' has no assistant message to train on"),
    ({"prompt": "hi", "completion": CONVERSATION[2:3]},
     r"'completion' is a list of chat messages but 'prompt' is text"),
    ({"messages": "hi"}, r"'messages' must be a list of chat messages"),
    ({"text": ["a"]}, r"'text' must be text"),
    ({"prompt": "hi"}, r"record 2 has neither of the response keys data.response_key=auto looks "
                       r"for \(completion, response; it has: prompt\)"),
    ({"question": "hi"}, r"record 2 has no 'prompt' field \(it has: question\), nor 'messages' "
                         r"or 'text'.*set data.prompt_key, data.messages_key or data.text_key"),
])
def test_malformed_sft_records_name_file_line_and_fix(tmp_path: Path, record: dict,
                                                      message: str) -> None:
    path = tmp_path / "d.jsonl"
    with pytest.raises(DataError, match=rf"^{path}, line 2: {message}"):
        sft_samples(tmp_path, {"messages": CONVERSATION}, record)


def test_a_template_that_rewrites_earlier_turns_is_named(tmp_path: Path) -> None:
    # Earlier assistant turns rendered shorter than the last (as reasoning templates drop
    # their thinking): the turns cannot be found by prefix, so the record is an error.
    rewriting = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
                 "{{ 'a:' + m['content'][:1] + eos_token }}{% else %}"
                 "{{ m['role'][0] + ':' + m['content'] + eos_token }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")
    with pytest.raises(DataError, match=r"line 1: the chat template renders the conversation "
                                        r"through message 3 differently .* generation"):
        sft_samples(tmp_path, {"messages": CONVERSATION}, template=rewriting)


def test_rl_reads_a_conversational_completion_file_as_before(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rl.jsonl", {"prompt": CONVERSATION[:2],
                                               "completion": CONVERSATION[2:], "answer": "7"})
    (sample,) = load_text_samples(DataConfig(source="file", path=str(path)), seed=0,
                                  require_response=False)
    assert (sample.prompt, sample.response, sample.answer) == (CONVERSATION[:2], "", "7")


def test_sft_trains_a_chat_checkpoint_on_trls_messages(chat_checkpoint: Path,
                                                       tmp_path: Path) -> None:
    turns = [{"role": "user", "content": "Ada has 3 apples and gets 4 more."},
             {"role": "assistant", "content": "The answer is \\boxed{7}."},
             {"role": "user", "content": "And 2 more?"},
             {"role": "assistant", "content": "#### 9"}]
    path = write_jsonl(tmp_path / "chat.jsonl", *[{"messages": turns}] * 4,
                       *[{"prompt": turns[:2], "completion": turns[2:]}] * 4)
    rows = graft.train(graft.compose([
        f"trainer.run_dir={tmp_path / 'run'}", "trainer.mode=sft", f"model.path={chat_checkpoint}",
        "engine.device=cpu", "data.source=file", f"data.path={path}", f"data.val_path={path}",
        "trainer.total_steps=3", "trainer.val_every_steps=3", "trainer.global_batch_size=4",
        "optim.lr=0.01", "checkpoint.save_at_end=false", "export.hf_at_end=false"]))
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert rows[3]["val/loss"] < rows[0]["val/loss"]
    assert rows[3]["epoch"] == 1.5
