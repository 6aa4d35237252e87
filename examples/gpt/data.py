"""The corpus and the batches: byte-level tokens of a real text that ships with Python itself.

pydoc_data.topics is the text of the Python language reference and library documentation that
`help()` shows (about 460 kB of English prose and code), part of every CPython installation, so
the demo needs no network and no download.
"""

from __future__ import annotations

import numpy as np

VOCAB = 256  # one token per byte


def corpus() -> tuple[bytes, str]:
    """The corpus bytes and a one-line description of where they come from."""
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
    return text.encode(
        "utf-8"
    ), f"{topics.__file__} (the Python documentation behind help(), {len(topics.topics)} topics)"


class Batches:
    """Training batches of random windows and a fixed validation set, all drawn from one seed.

    The windows are chosen once (numpy, not torch) so every recipe sees the same data in the same
    order, and no torch op runs before the per-recipe worker processes start.
    """

    def __init__(self, data: bytes, seq: int, batch: int, steps: int, seed: int = 1234, val_batches: int = 8):
        tokens = np.frombuffer(data, dtype=np.uint8)
        split = int(len(tokens) * 0.9)
        self.train, self.val = tokens[:split], tokens[split:]
        rng = np.random.default_rng(seed)
        self.seq = seq
        self.train_starts = rng.integers(0, len(self.train) - seq - 1, size=(steps, batch))
        self.val_starts = rng.integers(0, len(self.val) - seq - 1, size=(val_batches, batch))

    @staticmethod
    def _windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
        return np.stack([tokens[s : s + length] for s in starts]).astype(np.int64)

    def train_batch(self, step: int) -> np.ndarray:
        """[batch, seq + 1] token ids: inputs are [:, :-1], targets [:, 1:]."""
        return self._windows(self.train, self.train_starts[step], self.seq + 1)

    def val_batches(self):
        for starts in self.val_starts:
            yield self._windows(self.val, starts, self.seq + 1)

    def prompts(self, count: int, length: int) -> np.ndarray:
        """[count, length] prompts from the validation text, each at the start of a line of prose
        (a newline, then a capital letter)."""
        text = self.val[: -length - 1]
        starts = np.flatnonzero((text[:-1] == ord("\n")) & (text[1:] >= ord("A")) & (text[1:] <= ord("Z"))) + 1
        step = max(1, len(starts) // count)
        return self._windows(self.val, starts[::step][:count], length)
