"""llama2.c's tokenizer (tokenizer.bin: max piece length, then per piece a float score, a
length and the bytes) as a Hugging Face fast tokenizer, so that a converted llama2.c model
runs in Hugging Face pipelines and loads with AutoTokenizer.from_pretrained (kvpress's
"kv-press-text-generation" pipeline and its KVzip press among them).

Encoding is llama2.c's `encode`: each character's piece (its UTF-8 bytes as byte pieces
<0x..> at ids 3..258 when it has none), then merging the adjacent pair with the best score
until none merges. As a `tokenizers` BPE that is: the vocabulary as is, byte fallback, and
one merge per way of splitting a piece into two pieces, ranked by the merged piece's score
(llama2.c breaks a tie between two pieces' scores by position, this by id; tok512's scores
are distinct). No dummy-prefix space is added (texts that continue a story start with ' ',
as llama2.c's run.c prompts do after its own prefix). Ids 0, 1, 2 are <unk>, <s> (BOS,
added with add_special_tokens) and </s> (EOS). Use
centroidkv.convert_llama2c.tokenizer_to_transformers(path).
"""
from __future__ import annotations

import struct

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


def fast_tokenizer(path):
    """The tokenizer.bin at `path` as a transformers PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    pieces, scores = read_pieces(path)
    tokens = [SPECIAL.get(i) or (f"<0x{i - 3:02X}>" if i in BYTE_PIECES else
                                 p.decode("utf-8", errors="replace"))
              for i, p in enumerate(pieces)]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{path}: two pieces have the same text")
    text_pieces = {t for i, t in enumerate(tokens) if i not in SPECIAL and i not in BYTE_PIECES}
    merges = [(t[:k], t[k:])
              for i in sorted(range(len(tokens)), key=lambda i: -scores[i])
              if tokens[i] in text_pieces
              for t in [tokens[i]] for k in range(1, len(t))
              if t[:k] in text_pieces and t[k:] in text_pieces]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=SPECIAL[0],
                                   byte_fallback=True, fuse_unk=False))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in SPECIAL.values()])
    backend.post_processor = processors.TemplateProcessing(  # BOS, as llama2.c's encode
        single=f"{SPECIAL[1]} $A", pair=f"{SPECIAL[1]} $A $B", special_tokens=[(SPECIAL[1], 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=SPECIAL[0],
                                   bos_token=SPECIAL[1], eos_token=SPECIAL[2],
                                   clean_up_tokenization_spaces=False,
                                   model_max_length=1 << 30)
