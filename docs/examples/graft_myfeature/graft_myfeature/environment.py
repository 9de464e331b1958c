"""Two multi-turn environments (graft-multiturn), chosen by features.multiturn.environment:
hints: the model may ask for a hint (a turn ending with "?"), the first half of the answer;
lengths: the model may call a typed tool, word_length, in its chat template's own format."""

from typing import Annotated

from graft import hookimpl
from graft_multiturn import MalformedAction
from graft_multiturn.tools import ToolEnvironment


class HintEnvironment:
    """One episode: Graft builds a fresh one per episode (the factory is the class itself)."""

    stop = ("?",)     # a turn ends right after its first "?" (Graft cuts the sampled tokens)

    def reset(self, sample):
        self.answer = sample.answer or ""
        return None   # the sample's own prompt, as the data loader encoded it

    def step(self, action_ids, action_text):
        if not action_text.endswith("?"):
            return None, None, True   # the answer: done, scored by algorithm.reward
        if action_text.startswith("?"):
            raise MalformedAction("a question without words")   # the episode scores 0
        hint = self.answer[:len(self.answer) // 2]
        return f" hint: {hint}\n", -0.1, False   # text, tokenised alone; -0.1 per hint


def word_length(word: Annotated[str, "one word"]) -> int:
    """How many letters a word has."""
    return len(word)


def lengths_environment(tokenizer):
    """One episode with the word_length tool: its schema goes into the prompt through the
    chat template's tools, the model's calls are read in the template's format (auto:
    <tool_call>{json}</tool_call> for Qwen-style templates), one call a turn, two at most."""
    return ToolEnvironment([word_length], tokenizer=tokenizer, max_calls=2,
                           stop_after_call=True)


@hookimpl
def graft_environments():
    return {"hints": HintEnvironment, "lengths": lengths_environment}
