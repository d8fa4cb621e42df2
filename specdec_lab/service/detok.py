"""Text as tokens arrive, with stop strings: what may be sent now, and where the answer stops.

The whole answer is decoded again at every step (decoding a prefix alone can split a character or a
word-piece that the next token completes); text that could still turn into a stop string, or a trailing
U+FFFD (half of a multi-byte character), is held back until the next tokens decide it.
"""


class Detokenizer:
    def __init__(self, tokenizer, stops=()):
        self.tokenizer, self.stops = tokenizer, list(stops)
        self.ids: list = []
        self.sent = ""  # text handed out so far
        self.stopped = False  # a stop string was found: the answer ends before it

    def add(self, new_ids) -> str:
        """The text that may be sent after these new tokens (possibly empty)."""
        if self.stopped:
            return ""
        self.ids += new_ids
        return self._advance(final=False)

    def flush(self) -> str:
        """The text held back, at the answer's end."""
        return "" if self.stopped else self._advance(final=True)

    @property
    def text(self) -> str:
        return self.sent

    def _advance(self, final) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped, text = True, text[:cut]
        elif not final:
            text = text[:len(text) - self._held(text)]
        if not text.startswith(self.sent):  # a later token changed earlier text: send only what extends it
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _first_stop(self, text):
        start = max(0, len(self.sent) - max((len(s) for s in self.stops), default=0))
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _held(self, text) -> int:
        """Characters at the end of `text` that may not be sent yet."""
        held = len(text) - len(text.rstrip("\ufffd"))
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    held = max(held, n)
                    break
        return held
