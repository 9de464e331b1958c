"""Chat prompts rendered with the tokenizer's chat template (or a Jinja file's) and its
generation prompt; plain-text prompts tokenized as they are; chat prompts without a template
are an error, never their Python repr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graft.config import DataConfig
from graft.data.dataset import encode_prompts, load_prompts
from graft.data.tasks import TextSample
from graft.data.tokenizer import builtin_tokenizer, load_tokenizer
from graft.errors import ConfigError, DataError
from graft.testing.chat import gsm8k_rows, messages_of, write_chat_checkpoint

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def template_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


def test_verl_prompts_get_the_chat_template_and_generation_prompt(verl_gsm8k: Path,
                                                                  chat_tokenizer: Any) -> None:
    prompts = load_prompts(DataConfig(source="file", path=str(verl_gsm8k)), chat_tokenizer,
                           seed=0)
    rows = gsm8k_rows(8)
    assert prompts.ids == [template_ids(chat_tokenizer, messages_of(r)) for r in rows]
    text = chat_tokenizer.decode(prompts.ids[0])
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert "[{" not in text and "'role'" not in text


def test_text_prompts_are_tokenized_as_they_are(chat_tokenizer: Any) -> None:
    text = "Ada has 3 apples. How many? "
    (ids,) = encode_prompts([TextSample(text, "", "3")], chat_tokenizer, max_tokens=64).ids
    assert ids == chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    builtin = builtin_tokenizer()
    (ids,) = encode_prompts([TextSample("copy ab:", "", "ab")], builtin, max_tokens=64).ids
    assert ids == [builtin.bos_token_id, *builtin("copy ab:", add_special_tokens=False)["input_ids"]]


def test_a_jinja_file_replaces_the_tokenizers_template(tmp_path: Path,
                                                       chat_tokenizer: Any) -> None:
    file = tmp_path / "plain.jinja"
    file.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}")
    (ids,) = encode_prompts([TextSample(CHAT, "", "4")], chat_tokenizer, max_tokens=128,
                            chat_template=str(file)).ids
    assert chat_tokenizer.decode(ids) == "system: Be brief.\nuser: 2+2?\nassistant:"


def test_chat_prompts_without_a_template_are_errors(tmp_path: Path, chat_tokenizer: Any) -> None:
    sample = TextSample(CHAT, "", "4", origin="data.jsonl, line 7")
    with pytest.raises(DataError, match=r"^data.jsonl, line 7: the prompt is a list of chat "
                                        r"messages, but data.chat_template=none; set "
                                        r"data.chat_template to a Jinja file"):
        encode_prompts([sample], chat_tokenizer, max_tokens=64, chat_template="none")
    bare = load_tokenizer(None, str(write_chat_checkpoint(tmp_path / "bare",
                                                          chat_template=False)))
    with pytest.raises(DataError, match=r"line 7: the prompt is a list of chat messages, but "
                                        r"the tokenizer \(.*bare\) has no chat template"):
        encode_prompts([sample], bare, max_tokens=64)
    with pytest.raises(DataError, match=r"has no chat template"):
        encode_prompts([sample], builtin_tokenizer(), max_tokens=64)


def test_a_missing_template_file_is_a_config_error(chat_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"data.chat_template='/no/such.jinja' is neither "
                                          r"auto, none nor a Jinja file"):
        encode_prompts([TextSample(CHAT, "", "4")], chat_tokenizer, max_tokens=64,
                       chat_template="/no/such.jinja")


def test_a_template_that_cannot_render_names_the_sample(tmp_path: Path,
                                                        chat_tokenizer: Any) -> None:
    file = tmp_path / "strict.jinja"
    file.write_text("{% if messages[0]['role'] == 'system' %}"
                    "{{ raise_exception('no system messages') }}{% endif %}")
    with pytest.raises(DataError, match=r"^f.parquet, row 2: the chat template cannot render "
                                        r"this prompt: .*no system messages"):
        encode_prompts([TextSample(CHAT, "", "4", origin="f.parquet, row 2")], chat_tokenizer,
                       max_tokens=64, chat_template=str(file))
