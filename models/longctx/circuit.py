"""The retrieval circuit of the long-context model, set analytically.

A 3-layer Llama (RoPE base 500000, GQA 6 query / 2 KV heads of size 64) gets, before any
training, weights that answer the retrieval tasks of tasks.py ("circuit" format) from its full
cache; training then learns the language on the remaining weights while these entries are
held (`Circuit.hold`). Why by hand: on this 2-core CPU the copy ("induction") circuit never
formed by gradient descent within ~7M tokens (README.md, "History").

How it answers " ... The key for the apple:4821. ... The key for the apple:" -> "4821":
the residual stream has `RESERVED` dimensions (`Layout`) that the circuit reads and writes and
that the language model may read but never write; every other dimension is the language
model's.
- Embedding features: a constant, ':' , digit flag, digit identity (10), the fact name's
  last token as a 16-dim +-Hadamard code (29 names), "is a variable", BOS.
- Layer 1: four previous-token heads (offsets 1-4) write "the token d back is ':'" (U1-U4:
  the position of a digit inside its number) and the previous token's name code; a
  name-repeat head writes 1/(n+2) for a name seen n times before (BOS as the sink), and
  six FFN units turn that into "updated at least 1/2/3 times" (BINS).
- Layer 2: a tag head attends to the nearest ':' (within 6 tokens, else BOS) and copies the
  name before it (TAG); a second head copies the BINS of the nearest variable name.
- Layer 3: the lookup head matches the query's TAG and "next digit index" against each
  position's TAG and digit index (and, for variables, prefers the most updated), and copies
  that position's digit into the digit-identity dimensions, which the tied classifier reads.
Content matching uses the slowest RoPE pairs (base 500000: under 0.06 rad over 1024 tokens),
positions the fastest ones (profiles fitted by `fit_peak` / `fit_box`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llama import Config, Transformer, Tokenizer

ROPE_THETA = 500000.0
HEAD = 64
PAIRS = HEAD // 2
CONST = 8.0  # the constant feature: dominates the residual norm, so RMSNorm scales stay put


def hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


class Layout:
    """Named slots of the residual stream: the circuit's dimensions first, then the LM's."""

    SLOTS = (("const", 1), ("colon", 1), ("digit", 1), ("dcode", 10), ("ncode", 16),
             ("isvar", 1), ("bos", 1), ("u", 4), ("pncode", 16), ("pvar", 1), ("phi", 1),
             ("bins", 3), ("tag", 16), ("tagvar", 1), ("tagbins", 3))

    def __init__(self):
        self.at = {}
        i = 0
        for name, n in self.SLOTS:
            self.at[name] = list(range(i, i + n))
            i += n
        self.reserved = i

    def __getitem__(self, name):
        return self.at[name]


@dataclass
class Vocab:
    colon: int
    bos: int
    digits: list[int]   # token of '0'..'9'
    names: list[int]    # last token of each fact name (passkey, objects, variables)
    variables: list[int]


def vocab_of(tok: Tokenizer, passkey_name: str, objects, variables) -> Vocab:
    last = lambda s: tok.encode(s)[-1]  # noqa: E731
    names = [last(passkey_name)] + [last(" the " + o) for o in objects] + [last(" " + v) for v in variables]
    assert len(set(names)) == len(names), "fact names must end in distinct tokens"
    return Vocab(colon=tok.lookup[b":"], bos=1, digits=[tok.encode(str(d))[0] for d in range(10)],
                 names=names, variables=[last(" " + v) for v in variables])


def thetas(theta: float = ROPE_THETA) -> torch.Tensor:
    return theta ** (-torch.arange(0, HEAD, 2, dtype=torch.float64) / HEAD)


@torch.enable_grad()
def fit_peak(offset: int, pairs: int, length: int, steps: int = 1500):
    """Weights w >= 0 (sum 1) over the `pairs` fastest RoPE pairs so that
    sum_p w_p cos(theta_p (delta - offset)) peaks at delta = offset with the largest margin
    over every other delta in [0, length): a previous-token head's positional profile.
    Returns (w, margin)."""
    th = thetas()[:pairs]
    x = torch.arange(length, dtype=torch.float64) - offset
    x = x[x != 0]
    gap = 1 - torch.cos(th[None, :] * x[:, None])  # [X, P]
    logits = torch.zeros(pairs, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    for _ in range(steps):
        w = torch.softmax(logits, 0)
        m = gap @ w
        loss = -(-torch.logsumexp(-m / 0.003, 0) * 0.003)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = torch.softmax(logits, 0).detach()
    return w, float((gap @ w).min())


class Circuit:
    """Builds the circuit into a fresh Transformer and remembers which entries it owns."""

    # Query heads (per layer, GQA groups of 3: heads 0-2 read KV head 0, heads 3-5 KV head 1).
    OFFSET_HEADS = {1: 0, 2: 1, 3: 2, 4: 3}  # offset -> layer-1 head
    REPEAT_HEAD = 4
    TAG_HEAD, VARBINS_HEAD = 0, 1           # layer 2
    LOOKUP_HEAD = 0                         # layer 3
    BIN_THRESHOLDS = (0.4167, 0.2917, 0.225)  # between 1/(n+2) for n = 0..3 and n >= 4

    # Pairs of a head: fast ones for positions, slow ones for content.
    FAST = 12
    SLOW_CODE = list(range(24, 32))  # 8 pairs = 16 dims: name codes

    def __init__(self, model: Transformer, vocab: Vocab):
        cfg = model.cfg
        assert cfg.head_size == HEAD and cfg.n_layers == 3 and cfg.n_heads == 6 and cfg.n_kv_heads == 2
        assert abs(cfg.rope_theta - ROPE_THETA) < 1e-6
        self.model, self.vocab, self.cfg = model, vocab, cfg
        self.lay = Layout()
        self.held: dict[str, torch.Tensor] = {}  # parameter name -> bool mask
        d = cfg.dim
        self.rho = 1.0 / nominal_rms(d)  # the nominal RMSNorm gain
        self.params = dict(model.named_parameters())
        self._key_rows: dict[int, set[int]] = {}
        for name, p in self.params.items():
            self.held[name] = torch.zeros_like(p, dtype=torch.bool)
        with torch.no_grad():
            self._embedding()
            self._layer1()
            self._layer2()
            self._layer3()
        self.values = {n: self.params[n].detach()[m].clone() for n, m in self.held.items()}

    # -- helpers ---------------------------------------------------------------------------
    def _hold(self, name, rows=None, cols=None):
        m = self.held[name]
        if m.dim() == 1:
            m[rows] = True
        elif rows is not None and cols is not None:
            m[torch.tensor(rows)[:, None], torch.tensor(cols)[None, :]] = True
        elif rows is not None:
            m[rows] = True
        else:
            m[:, cols] = True

    def _p(self, layer, what):
        return self.params[f"layers.{layer}.{what}"], f"layers.{layer}.{what}"

    def _reserve_rows(self, layer, what, rows):
        """Rows (output features) that belong to the circuit: zeroed, then held."""
        w, name = self._p(layer, what)
        w[rows] = 0
        self._hold(name, rows=rows)
        return w

    def _qrow(self, head, pair, comp):
        return head * HEAD + 2 * pair + comp

    # -- embedding and norms ---------------------------------------------------------------
    def _embedding(self):
        lay, v, E = self.lay, self.vocab, self.params["embedding.weight"]
        res = list(range(lay.reserved))
        E[:, res] = 0
        E[:, lay["const"][0]] = CONST
        E[v.colon, lay["colon"][0]] = 1
        for i, t in enumerate(v.digits):
            E[t, lay["digit"][0]] = 1
            E[t, lay["dcode"][i]] = 1
        codes = torch.cat([hadamard(16), -hadamard(16)])[1:] / 4.0  # unit norm, 31 codes
        self.codes = {}
        for i, t in enumerate(v.names):
            E[t, lay["ncode"]] = codes[i]
            self.codes[t] = codes[i]
        for t in v.variables:
            E[t, lay["isvar"][0]] = 1
        E[v.bos, lay["bos"][0]] = 1
        self._hold("embedding.weight", cols=res)
        # BOS and the variables keep their whole (initial) rows: the name-repeat head weighs
        # BOS against a variable's earlier occurrences, so their RMSNorm scales must stay
        # known (a 1% drift is 0.4 logits there, enough to move 1/(n+2) across a bin edge).
        self._hold("embedding.weight", rows=[v.bos] + list(v.variables))
        for layer in range(self.cfg.n_layers):
            for norm in ("rms_att", "rms_ffn"):
                w, name = self._p(layer, norm)
                w[res] = 1
                self._hold(name, rows=res)
        g = self.params["rms_final"]
        g[res] = 0
        g[lay["dcode"]] = 1.0
        self._hold("rms_final", rows=res)
        # The language model writes only its own dimensions.
        lm_out = res
        for layer in range(self.cfg.n_layers):
            for what in ("wo.weight", "w2.weight"):
                w, name = self._p(layer, what)
                w[lm_out] = 0
                self._hold(name, rows=lm_out)

    # -- positional keys/queries -----------------------------------------------------------
    def _positional_key(self, layer, kv, amp=1.0):
        """KV head `kv` of `layer`: fast pairs read the constant, phase 0."""
        wk = self._reserve_rows(layer, "wk.weight", [kv * HEAD + 2 * p + c for p in range(self.FAST) for c in (0, 1)])
        c = self.lay["const"][0]
        for p in range(self.FAST):
            wk[kv * HEAD + 2 * p, c] = amp / (self.rho * CONST)
        return amp

    def _positional_query(self, wq, head, weights, phases, scale):
        """score contribution = scale * sum_p weights_p cos(theta_p delta + phase_p), for a
        key made by _positional_key with amp 1."""
        c = self.lay["const"][0]
        for p in range(len(weights)):
            a = 8.0 * scale * float(weights[p]) / (self.rho * CONST)
            wq[self._qrow(head, p, 0), c] = a * math.cos(phases[p])
            wq[self._qrow(head, p, 1), c] = a * math.sin(phases[p])

    def _feature_key(self, layer, kv, pair, comp, feats, amp=1.0):
        """Key row (pair, comp) of KV head kv = amp * sum of features (name -> coefficient)."""
        wk, name = self._p(layer, "wk.weight")
        row = kv * HEAD + 2 * pair + comp
        partner = row ^ 1  # the pair's other row: it rotates into this one, so it is zeroed too
        set_rows = self._key_rows.setdefault(layer, set())
        if partner not in set_rows:
            wk[partner] = 0
            self._hold(name, rows=[partner])
        wk[row] = 0
        for f, coef in feats.items():
            wk[row, f] = amp * coef / self.rho
        self._hold(name, rows=[row])
        set_rows.add(row)

    def _feature_query(self, wq, head, pair, comp, feats, score):
        """Query row: the product with a key of amp 1 and features of value 1 = score."""
        row = self._qrow(head, pair, comp)
        for f, coef in feats.items():
            wq[row, f] = 8.0 * score * coef / self.rho

    def _value(self, layer, kv, row, feature):
        wv, name = self._p(layer, "wv.weight")
        r = kv * HEAD + row
        wv[r] = 0
        wv[r, feature] = 1.0 / self.rho
        self._hold(name, rows=[r])
        return r

    def _out(self, layer, head, vrow_in_head, target, gain=1.0):
        wo, _ = self._p(layer, "wo.weight")
        wo[target, head * HEAD + vrow_in_head] = gain

    def _query_head(self, layer, head):
        wq = self._reserve_rows(layer, "wq.weight", list(range(head * HEAD, (head + 1) * HEAD)))
        return wq

    # -- layer 1: previous-token heads, name repeats, update bins --------------------------
    def _layer1(self):
        lay, L = self.lay, 0
        th = thetas()
        self.peaks = {}
        for kv in (0, 1):
            self._positional_key(L, kv)
        # values: KV0 carries ':' , the name code and "is a variable"; KV1 ':' and BOS
        v_colon0 = self._value(L, 0, 63, lay["colon"][0])
        v_code0 = [self._value(L, 0, 62 - i, lay["ncode"][i]) for i in range(16)]
        v_var0 = self._value(L, 0, 45, lay["isvar"][0])
        v_colon1 = self._value(L, 1, 63, lay["colon"][0]) - HEAD
        v_bos1 = self._value(L, 1, 62, lay["bos"][0]) - HEAD
        for offset in range(7):  # 1-4 here, 0-6 for layer 2's offset-selecting queries
            self.peaks[offset] = fit_peak(offset, self.FAST, self.cfg.seq_len)
        for offset, head in self.OFFSET_HEADS.items():
            w, margin = self.peaks[offset]
            wq = self._query_head(L, head)
            self._positional_query(wq, head, w, [-offset * float(t) for t in th[:self.FAST]],
                                   scale=16.0 / margin)
            kv = head // 3
            vr = v_colon0 if kv == 0 else v_colon1
            self._out(L, head, vr % HEAD, lay["u"][offset - 1])
            if offset == 1:
                for i, r in enumerate(v_code0):
                    self._out(L, head, r % HEAD, lay["pncode"][i])
                self._out(L, head, v_var0 % HEAD, lay["pvar"][0])
        # name repeats (KV1): name code in the slow pairs, BOS as the sink in pair 23
        h = self.REPEAT_HEAD
        wq = self._query_head(L, h)
        for i in range(16):
            pair, comp = self.SLOW_CODE[i // 2], i % 2
            self._feature_key(L, 1, pair, comp, {lay["ncode"][i]: 1.0})
            self._feature_query(wq, h, pair, comp, {lay["ncode"][i]: 1.0}, 20.0)
        E = self.params["embedding.weight"]
        var_norm = float(E[list(self.vocab.variables)].norm(dim=1).mean())
        bos_amp = float(E[self.vocab.bos].norm()) / var_norm  # BOS weighs as one occurrence
        self._feature_key(L, 1, 23, 0, {lay["bos"][0]: 1.0}, amp=bos_amp)
        self._feature_query(wq, h, 23, 0, {lay["const"][0]: 1.0 / CONST}, 20.0)
        self._out(L, h, v_bos1 % HEAD, lay["phi"][0])
        # FFN: bins b_i = [phi < t_i] as silu(y) - silu(y - 1), y = K (t_i - phi)
        w1, n1 = self._p(L, "w1.weight")
        w3, n3 = self._p(L, "w3.weight")
        w2, n2 = self._p(L, "w2.weight")
        c, phi = lay["const"][0], lay["phi"][0]
        K = 400.0
        for i, t in enumerate(self.BIN_THRESHOLDS):
            for j, shift in enumerate((0.0, 1.0)):
                u = 2 * i + j
                for w in (w1, w3):
                    w[u] = 0
                w1[u, c] = (K * t - shift) / (self.rho * CONST)
                w1[u, phi] = -K / self.rho
                w1[u, c] -= K / (self.rho * CONST)  # not a variable: y < -K / 2, no bin
                w1[u, lay["isvar"][0]] = K / self.rho
                w3[u, c] = 1.0 / (self.rho * CONST)
                w2[:, u] = 0
                w2[lay["bins"][i], u] = 1.0 if j == 0 else -1.0
        units = list(range(2 * len(self.BIN_THRESHOLDS)))
        self._hold(n1, rows=units)
        self._hold(n3, rows=units)
        self._hold(n2, cols=units)

    # -- layer 2: the tag of each position -------------------------------------------------
    def _offset_selecting_query(self, wq, head, shift, scale):
        """A query that attends exactly to the ':' of the number the position is in (shift 0)
        or to the token before it (shift 1): ':' itself -> offset 0, U_k -> offset k, a digit
        with no ':' within 4 -> offset 5 (a pass key's 5th digit), each with the
        previous-token heads' profile; anywhere else, the BOS sink."""
        lay, th = self.lay, thetas()
        u, digit = lay["u"], lay["digit"][0]
        fifth = {digit: 1.0, u[0]: -1.0, u[1]: -1.0, u[2]: -1.0, u[3]: -1.0}
        feats = [{lay["colon"][0]: 1.0}] + [{f: 1.0} for f in u] + [fifth]
        for k, fs in enumerate(feats):
            w = self.peaks[k + shift][0]
            for p in range(self.FAST):
                phase = -(k + shift) * float(th[p])
                a = 8.0 * scale * float(w[p]) / self.rho
                for f, coef in fs.items():
                    wq[self._qrow(head, p, 0), f] += coef * a * math.cos(phase)
                    wq[self._qrow(head, p, 1), f] += coef * a * math.sin(phase)
        # active = ':' or a digit (U_k only ever follows a ':' by k digits)
        sink = {lay["colon"][0]: -1.0, digit: -1.0, lay["const"][0]: 1.0 / CONST}
        self._feature_query(wq, head, 29, 0, sink, self.M_SINK)

    def _layer2(self):
        lay, L = self.lay, 1
        self._positional_key(L, 0)
        self._feature_key(L, 0, 29, 0, {lay["bos"][0]: 1.0})
        v_code = [self._value(L, 0, 63 - i, lay["pncode"][i]) for i in range(16)]
        v_var = self._value(L, 0, 47, lay["pvar"][0])
        v_bins = [self._value(L, 0, 46 - i, lay["bins"][i]) for i in range(3)]
        scale = 16.0 / min(m for _, m in self.peaks.values())
        for head, shift in ((self.TAG_HEAD, 0), (self.VARBINS_HEAD, 1)):
            self._offset_selecting_query(self._query_head(L, head), head, shift, scale)
        for i, r in enumerate(v_code):
            self._out(L, self.TAG_HEAD, r, lay["tag"][i])
        self._out(L, self.TAG_HEAD, v_var, lay["tagvar"][0])
        for i, r in enumerate(v_bins):
            self._out(L, self.VARBINS_HEAD, r, lay["tagbins"][i])

    # -- layer 3: the lookup ---------------------------------------------------------------
    M_TAG, M_COUNT, M_BIN, M_SINK = 30.0, 16.0, 7.0, 40.0

    def _layer3(self):
        lay, L, h = self.lay, 2, self.LOOKUP_HEAD
        wq = self._query_head(L, h)
        c = lay["const"][0]
        for i in range(16):
            pair, comp = self.SLOW_CODE[i // 2], i % 2
            self._feature_key(L, 0, pair, comp, {lay["tag"][i]: 1.0})
            self._feature_query(wq, h, pair, comp, {lay["tag"][i]: 1.0}, self.M_TAG)
        u = lay["u"]
        # digit index of a key: U1..U4, and "a digit with no ':' within 4" for the 5th
        key_count = [{u[0]: 1.0}, {u[1]: 1.0}, {u[2]: 1.0}, {u[3]: 1.0},
                     {lay["digit"][0]: 1.0, u[0]: -1.0, u[1]: -1.0, u[2]: -1.0, u[3]: -1.0}]
        # the query wants the next one: ':' -> 1st digit, U1 -> 2nd, ...
        query_count = [{lay["colon"][0]: 1.0}, {u[0]: 1.0}, {u[1]: 1.0}, {u[2]: 1.0}, {u[3]: 1.0}]
        slots = [(23, 0), (23, 1), (22, 0), (22, 1), (21, 0)]
        for (pair, comp), kf, qf in zip(slots, key_count, query_count):
            self._feature_key(L, 0, pair, comp, kf)
            self._feature_query(wq, h, pair, comp, qf, self.M_COUNT)
        for i, (pair, comp) in enumerate([(20, 0), (19, 0), (18, 0)]):
            self._feature_key(L, 0, pair, comp, {lay["tagbins"][i]: 1.0})
            self._feature_query(wq, h, pair, comp, {lay["tagvar"][0]: 1.0}, self.M_BIN)
        # the sink: inactive queries (not ':' nor inside a number) attend to BOS
        self._feature_key(L, 0, 21, 1, {lay["bos"][0]: 1.0})
        active = {lay["colon"][0]: -1.0, u[0]: -1.0, u[1]: -1.0, u[2]: -1.0, u[3]: -1.0, c: 1.0 / CONST}
        self._feature_query(wq, h, 21, 1, active, self.M_SINK)
        v_digit = [self._value(L, 0, 63 - i, lay["dcode"][i]) for i in range(10)]
        for i, r in enumerate(v_digit):
            self._out(L, h, r, lay["dcode"][i], gain=12.0)

    # -- training support ------------------------------------------------------------------
    def hold(self):
        """Puts the circuit's entries back (after an optimizer step)."""
        with torch.no_grad():
            for name, mask in self.held.items():
                if mask.any():
                    self.params[name][mask] = self.values[name]

    def mask_grads(self):
        for name, mask in self.held.items():
            p = self.params[name]
            if p.grad is not None and mask.any():
                p.grad[mask] = 0

    def held_count(self) -> int:
        return int(sum(int(m.sum()) for m in self.held.values()))


def nominal_rms(dim: int) -> float:
    """The residual RMS the circuit's weights assume (the constant and ~2 unit features)."""
    return math.sqrt(CONST ** 2 + 2.0) / math.sqrt(dim)


def config(vocab_size: int, seq_len: int = 1024, dim: int = 384, hidden: int = 512) -> Config:
    return Config(dim, hidden, 3, dim // HEAD, 2, vocab_size, seq_len, rope_theta=ROPE_THETA)
