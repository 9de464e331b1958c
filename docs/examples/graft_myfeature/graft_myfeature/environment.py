"""A multi-turn environment: the model may ask for a hint (a turn ending with "?"), and the
hint is the first half of the answer. Selected with features.multiturn.environment=hints (graft-multiturn)."""

from graft import hookimpl
from graft_multiturn import MalformedAction


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


@hookimpl
def graft_environments():
    return {"hints": HintEnvironment}
