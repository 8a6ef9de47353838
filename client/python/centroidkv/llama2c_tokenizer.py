"""llama2.c's tokenizer (tokenizer.bin: max piece length, then per piece a float score, a
length and the bytes) as a transformers PreTrainedTokenizer, so that a converted llama2.c
model runs in Hugging Face pipelines (kvpress's "kv-press-text-generation" among them).

Encoding is llama2.c's `encode`: each character's piece (its UTF-8 bytes as byte pieces
<0x..> at ids 3..258 when it has none), then merging the adjacent pair with the best score
until none merges. No dummy-prefix space is added (texts that continue a story start with
' ', as llama2.c's run.c prompts do after its own prefix). Ids 0, 1, 2 are <unk>, <s>
(BOS) and </s> (EOS). Use centroidkv.convert_llama2c.tokenizer_to_transformers(path).
"""
from __future__ import annotations

import struct

from transformers import PreTrainedTokenizer

SPECIAL = {0: "<unk>", 1: "<s>", 2: "</s>"}
BYTE_PIECES = range(3, 259)  # <0x00> .. <0xFF>


def read_pieces(path) -> tuple[list[bytes], list[float]]:
    """The pieces and their merge scores of a llama2.c tokenizer.bin."""
    with open(path, "rb") as f:
        data = f.read()
    offset, pieces, scores = 4, [], []
    while offset < len(data):
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        pieces.append(data[offset:offset + length])
        scores.append(score)
        offset += length
    return pieces, scores


class Llama2cTokenizer(PreTrainedTokenizer):
    """Tokens are the pieces' text (SPECIAL for 0-2, the <0x..> names for byte pieces)."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, path: str, **kwargs):
        self.pieces, self.scores = read_pieces(path)
        self.tokens = [SPECIAL.get(i) or (f"<0x{i - 3:02X}>" if i in BYTE_PIECES else
                                          p.decode("utf-8", errors="replace"))
                       for i, p in enumerate(self.pieces)]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        if len(self.ids) != len(self.tokens):
            raise ValueError(f"{path}: two pieces have the same text")
        self.by_bytes = {p: i for i, p in enumerate(self.pieces) if i not in SPECIAL}
        kwargs.setdefault("bos_token", SPECIAL[1])
        kwargs.setdefault("eos_token", SPECIAL[2])
        kwargs.setdefault("unk_token", SPECIAL[0])
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def get_vocab(self) -> dict:
        return dict(self.ids)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        ids = []
        for ch in text:
            piece = ch.encode("utf-8")
            if piece in self.by_bytes:
                ids.append(self.by_bytes[piece])
            else:
                ids.extend(b + 3 for b in piece)
        while True:
            best, at = None, -1
            for i in range(len(ids) - 1):
                j = self.by_bytes.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if j is not None and (best is None or self.scores[j] > self.scores[best]):
                    best, at = j, i
            if best is None:
                return [self.tokens[i] for i in ids]
            ids[at:at + 2] = [best]

    def _convert_token_to_id(self, token: str) -> int:
        return self.ids.get(token, 0)

    def _convert_id_to_token(self, index: int) -> str:
        return self.tokens[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = b""
        for token in tokens:
            i = self.ids.get(token, 0)
            out += bytes([i - 3]) if i in BYTE_PIECES else (b"" if i in SPECIAL else
                                                             self.pieces[i])
        return out.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix=None) -> tuple:
        return ()
