"""The training and evaluation data of the long-context model: fluent filler (stories sampled
from stories260K with its tokenizer) and the long-range tasks embedded in it.

Tasks (each fact is inserted at a sentence boundary of the filler; questions come at the end):
- passkey:  " The pass key is 38291."        ... " What is the pass key? The pass key is" -> " 38291"
- multikey: " The key for the apple is 4821." (2-6 such facts) ... asked about one of them
- vartrack: " X is now 512." then updated 2-4 times ... " What is X now? X is now" -> the last value

A sequence is exactly `length` tokens: BOS, filler with the facts, then the questions (each
followed by its answer and "."). The returned spans give, per question, the token range of its
answer (" " + digits), which is what exact-match checks, and where the question starts.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from llama import Tokenizer, load_llama2c

BOS = 1
NEWLINE = 13  # byte token <0x0A>
KINDS = ("passkey", "multikey", "vartrack")
# Fact, question and answer texts per format. "v0" (the committed model's): " is 38291", so
# the token before every number is the same " " and the fact's name sits 3-6 tokens back.
# "colon": the number follows ":" right after the fact's name, and each name's last token is
# distinct (COLON_OBJECTS), so the two tokens before a number name its fact: a shorter match
# for the copy circuit. Not yet shown to train faster (README.md).
FORMATS = {
    "v0": {"passkey": " The pass key is {v}. Remember it.",
           "passkey_q": " What is the pass key? The pass key is", "answer": " {v}",
           "multikey": " The key for the {o} is {v}.",
           "multikey_q": " What is the key for the {o}? The key for the {o} is",
           "vartrack": " {o} is now {v}.", "vartrack_q": " What is {o} now? {o} is now"},
    "colon": {"passkey": " The pass key:{v}. Remember it.",
              "passkey_q": " What is the pass key? The pass key:", "answer": "{v}",
              "multikey": " The key for the {o}:{v}.",
              "multikey_q": " What is the key for the {o}? The key for the {o}:",
              "vartrack": " Now {o}:{v}.", "vartrack_q": " What is {o} now? {o}:"},
}
# "circuit" (circuit.py): the colon texts, with variables that the stories almost
# never use (X, Z, Q, V, U: never in the 97k training-story tokens; G 4, R and K 10 times),
# so that a name's repeats count its updates.
FORMATS["circuit"] = dict(FORMATS["colon"])
V0_OBJECTS = ("apple", "ball", "cat", "dog", "tree", "bird", "cake", "car", "box", "hat", "fish",
              "book", "cup", "boat", "star", "flower", "house", "frog", "sun", "toy")
COLON_OBJECTS = ("apple", "ball", "cat", "dog", "tree", "bird", "car", "box", "fish", "book",
                 "cup", "flower", "house", "sun", "duck", "bell", "door", "cow", "pig", "moon")
VARIABLES = ("X", "Y", "Z", "W", "Q", "K", "R", "V")
CIRCUIT_VARIABLES = ("X", "Z", "Q", "V", "U", "G", "R", "K")
PASSKEY_NAME = " The pass key"  # the passkey fact's name; its last token is the tag


def sample_stories(model_path: str, count: int, max_len: int, seed: int, batch: int = 512,
                   temperature: float = 0.8) -> list[list[int]]:
    """`count` stories from stories260K: BOS, then tokens at `temperature` until the model emits
    BOS or EOS (a story ends) or `max_len` tokens; returned without the BOS."""
    model = load_llama2c(model_path).eval()
    gen = torch.Generator().manual_seed(seed)
    stories = []
    with torch.no_grad():
        while len(stories) < count:
            b = min(batch, count - len(stories))
            caches = model.new_caches(b, max_len + 1)
            tokens = torch.full((b, 1), BOS, dtype=torch.long)
            out = torch.zeros(b, max_len, dtype=torch.long)
            done = torch.zeros(b, dtype=torch.bool)
            lengths = torch.full((b,), max_len, dtype=torch.long)
            for pos in range(max_len):
                logits = model(tokens, caches, pos)[:, -1].float() / temperature
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
                ended = (~done) & ((nxt == BOS) | (nxt == 2))
                lengths[ended] = pos
                done |= ended
                out[:, pos] = nxt
                tokens = nxt[:, None]
                if bool(done.all()):
                    break
            for i in range(b):
                story = out[i, :lengths[i]].tolist()
                if len(story) >= 16:
                    stories.append(story)
    return stories[:count]


class TaskBuilder:
    def __init__(self, tok: Tokenizer, stories: list[list[int]], fmt: str = "v0"):
        self.tok = tok
        self.stories = stories
        self.fmt = FORMATS[fmt]
        self.objects = V0_OBJECTS if fmt == "v0" else COLON_OBJECTS
        self.variables = CIRCUIT_VARIABLES if fmt == "circuit" else VARIABLES
        self.period = tok.lookup[b"."]

    def _filler(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += self.stories[rng.randrange(len(self.stories))] + [NEWLINE]
        return out[:n]

    def _number(self, rng: random.Random, digits: int) -> str:
        return str(rng.randrange(10 ** (digits - 1), 10 ** digits))

    def build(self, rng: random.Random, length: int, asked: list[str] | None = None,
              present: list[str] | None = None, depth: float | None = None,
              copy_prob: float = 0.0, dense: bool = False):
        """One sequence. `asked`: the kinds questioned at the end (default: a random non-empty
        subset of `present`); `present`: the kinds whose facts are in the text (default: each
        with probability 0.7, at least the asked ones); `depth` in [0, 1]: where the first
        asked kind's deciding fact sits in the filler (default: uniform); `copy_prob`: the
        chance of a repeated random block (training only); `dense` (training only): every
        present kind asked, with several multi-key objects and every variable, so that a short
        sequence carries more answers."""
        enc = self.tok.encode
        f = self.fmt

        def fact(kind, o="", v=""):
            return enc(f[kind].format(o=o, v=v))

        def question(kind, o, v):
            return enc(f[kind + "_q"].format(o=o)), enc(f["answer"].format(v=v))
        small = length < 512  # fewer facts, so that short sequences keep some filler
        if present is None:
            present = [k for k in KINDS if rng.random() < 0.7] or [rng.choice(KINDS)]
            if asked:
                present = sorted(set(present) | set(asked), key=KINDS.index)
        if asked is None and dense:
            asked = list(present)
        if asked is None:
            asked = [k for k in present if rng.random() < 0.6] or [rng.choice(present)]
            rng.shuffle(asked)
        facts: list[tuple[str, list[int]]] = []  # (group, tokens), in text order per group
        questions: list[tuple[list[int], list[int]]] = []  # (question tokens, answer tokens)
        deciding: dict[str, int] = {}  # kind -> index into facts of the fact its answer needs
        for kind in present:
            if kind == "passkey":
                key = self._number(rng, 5)
                deciding[kind] = len(facts)
                facts.append((kind, fact(kind, v=key)))
                q = question(kind, "", key)
            elif kind == "multikey":
                objs = rng.sample(self.objects, rng.randint(2, 3 if small else 6))
                keys = [self._number(rng, 4) for _ in objs]
                pick = rng.randrange(len(objs))
                for i, (o, k) in enumerate(zip(objs, keys)):
                    if i == pick:
                        deciding[kind] = len(facts)
                    facts.append((f"mk{i}", fact(kind, o, k)))
                q = question(kind, objs[pick], keys[pick])
                if dense:  # several objects asked
                    for i in rng.sample(range(len(objs)), rng.randint(1, len(objs))):
                        if i != pick:
                            questions.append(question(kind, objs[i], keys[i]))
            else:
                names = rng.sample(self.variables, 1 if small else rng.randint(1, 2))
                asked_name = names[0]
                for name in names:
                    updates = rng.randint(2, 3 if small else 4)
                    for u in range(updates):
                        value = self._number(rng, 4)
                        group = f"var{name}"
                        if name == asked_name and u == updates - 1:
                            deciding[kind] = len(facts)
                            last = value
                        facts.append((group, fact(kind, name, value)))
                    if dense and name != asked_name:  # every variable asked
                        questions.append(question(kind, name, value))
                q = question(kind, asked_name, last)
            if kind in asked:
                questions.append(q)
        if copy_prob > 0 and rng.random() < copy_prob:
            # Training aid: a block of random pieces stated once and repeated at the end, the
            # densest signal for the copy ("induction") circuit the retrieval tasks need.
            block = [rng.randrange(259, len(self.tok.pieces)) for _ in range(rng.randint(8, 16))]
            facts.append(("copy", block))
            questions.append((block[:1], block[1:]))
        rng.shuffle(questions)
        q_tokens = sum(len(q) + len(a) + 1 for q, a in questions)
        fact_tokens = sum(len(t) for _, t in facts)
        n_filler = length - 1 - q_tokens - fact_tokens
        if n_filler < 16:
            raise ValueError(f"length {length} too short for the facts")
        filler = self._filler(rng, n_filler)
        bounds = [0] + [i + 1 for i, t in enumerate(filler) if t in (self.period, NEWLINE)]
        # Random boundaries; the facts of one group (a variable's updates) keep their order.
        placement = [rng.choice(bounds) for _ in facts]
        groups: dict[str, list[int]] = {}
        for idx, (group, _) in enumerate(facts):
            groups.setdefault(group, []).append(idx)
        for idxs in groups.values():
            for idx, slot in zip(idxs, sorted(placement[i] for i in idxs)):
                placement[idx] = slot
        if depth is not None and asked:
            first = deciding[asked[0]]
            target = min(bounds, key=lambda b: abs(b - depth * n_filler))
            # vartrack: the last update must stay last, so earlier updates of its variable move
            # before it.
            placement[first] = target
            group = facts[first][0]
            for idx in range(len(facts)):
                if idx != first and facts[idx][0] == group:
                    if idx < first and placement[idx] > target:
                        placement[idx] = rng.choice([b for b in bounds if b <= target])
                    if idx > first and placement[idx] < target:
                        placement[idx] = target
        inserts: dict[int, list[int]] = {}
        for idx in sorted(range(len(facts)), key=lambda i: (placement[i], i)):
            inserts.setdefault(placement[idx], []).extend(facts[idx][1])
        seq = [BOS]
        for i in range(n_filler + 1):
            seq += inserts.get(i, [])
            if i < n_filler:
                seq.append(filler[i])
        spans = []
        for q, a in questions:
            question_start = len(seq)
            seq += q
            spans.append((len(seq), len(seq) + len(a), question_start))
            seq += a + [self.period]
        assert len(seq) == length, (len(seq), length)
        return seq, spans


def batch(builder: TaskBuilder, rng: random.Random, size: int, length: int, answer_weight: float,
          copy_prob: float = 0.0, dense_frac: float = 0.0, text_weight: float = 1.0):
    """Inputs, targets and per-token loss weights for `size` training sequences; a
    `dense_frac` share of them dense (see TaskBuilder.build); text tokens weigh `text_weight`,
    answer tokens `answer_weight`."""
    xs, ws = [], []
    for _ in range(size):
        dense = rng.random() < dense_frac
        while True:  # a short sequence may not fit every fact drawn: draw again
            try:
                seq, spans = builder.build(rng, length + 1, copy_prob=copy_prob, dense=dense)
                break
            except ValueError:
                continue
        w = np.full(length, text_weight, dtype=np.float32)
        for s, e, _ in spans:
            w[s - 1:e - 1] = answer_weight  # target index t predicts seq[t + 1]
        xs.append(seq)
        ws.append(w)
    x = torch.tensor(xs, dtype=torch.long)
    return x[:, :-1], x[:, 1:], torch.from_numpy(np.stack(ws))


def copy_batch(rng: random.Random, size: int, length: int, vocab: int, answer_weight: float,
               text_weight: float):
    """The induction warm-up: `size` sequences of random blocks (8-24 pieces of the merged
    vocabulary), each stated twice in a row; the second statement's tokens after its first are
    the answers (weight `answer_weight`), the rest weigh `text_weight`. The densest signal there
    is for the copy circuit the retrieval tasks need."""
    xs, ws = [], []
    for _ in range(size):
        seq, w = [BOS], [text_weight]
        while len(seq) < length + 1:
            block = [rng.randrange(259, vocab) for _ in range(rng.randint(8, 24))]
            seq += block + block
            w += [text_weight] * (len(block) + 1) + [answer_weight] * (len(block) - 1)
        xs.append(seq[:length + 1])
        ws.append(w[1:length + 1])  # weight of target t (predicting seq[t + 1])
    x = torch.tensor(xs, dtype=torch.long)
    return x[:, :-1], x[:, 1:], torch.tensor(ws, dtype=torch.float32)
