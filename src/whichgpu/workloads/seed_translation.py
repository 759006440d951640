"""Machine-translation models of Lambda Labs' 2020 GPU benchmark, written in plain PyTorch.

Over 600 lines because it restates three reference translation models layer by layer
(fairseq's Transformer and ConvS2S, XLM).

Transformer (big) on WMT'16 en-de (fairseq ``transformer_vaswani_wmt_en_de_big``), ConvS2S on
WMT'14 en-de (fairseq ``fconv_wmt_en_de``) and the unsupervised en-de MT model of XLM
(facebookresearch/XLM, ``--encoder_only false``). Layer shapes and parameter counts follow
those reference implementations; weights are random and inputs synthetic.

Lambda counts these batches in tokens: here ``seq_len`` is the sentence length (source and
target alike; default 128), ``batch_size`` the number of sentence pairs, and throughput is
counted in target tokens (``units_per_sample = seq_len``). Sentences are unpadded and all the
same length, so no padding masks are built (the references drop an all-false mask too).
The unsupervised model's step is one denoising auto-encoding loss (XLM ``mt_step(en, en)``):
XLM's iteration also runs AE for German and two back-translation steps, each with its own
optimizer step, whose greedy generation has data-dependent lengths. torch is imported inside
the builders only.

The two fairseq models are traced at ``--precision fp16`` as fairseq's ``--fp16`` trains
(``BuiltWorkload.fp16_master_weights``: an fp16 model, a flat fp32 master copy of the
parameters and their gradients, 20 bytes of state per parameter), not as ``torch.amp``; and
all three keep the materialised attention scores of their 2019 code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import Batch, BuiltWorkload, Workload
from whichgpu.workloads.hf import default_dtype, model_device, weight_dtype
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

DEFAULT_SEQ_LEN = 128
"""Sentence length (tokens) when none is given."""

TRANSFORMER_VOCAB = 32768
"""Joined en-de BPE dictionary of fairseq's WMT'16 recipe (Ott et al. 2018, "Scaling Neural
Machine Translation"): ``fairseq-preprocess --joined-dictionary --nwordssrc 32768
--nwordstgt 32768`` on Google's ``wmt16_en_de_bpe32k`` data."""
TRANSFORMER_PAPER_VOCAB = 37000
"""The paper's shared source-target BPE vocabulary (Vaswani et al. 2017, section 5.1)."""
CONVS2S_VOCAB = 40000
"""Source and target dictionaries of ConvS2S: 40K joint BPE types (Gehring et al. 2017,
section 5.1; fairseq ``prepare-wmt14en2de.sh`` uses ``BPE_TOKENS=40000``)."""
XLM_VOCAB = 64699
"""XLM's en-de dictionary (60k BPE codes; ``vocab_size`` of ``xlm-mlm-ende-1024``)."""
XLM_LANGS = 2
XLM_MAX_POSITIONS = 512
"""``N_MAX_POSITIONS`` of XLM's ``TransformerModel``."""
FCONV_MAX_POSITIONS = 1024
"""``max_source_positions`` / ``max_target_positions`` of fairseq's ``fconv``."""
LABEL_SMOOTHING = 0.1

FAIRSEQ_PAD = 1
XLM_PAD = 2
FIRST_WORD = 4
"""Ids below this are special symbols (bos/pad/eos/unk); synthetic words start here."""

FCONV_WMT_EN_DE = [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
"""Layer spec of ``fconv_wmt_en_de``: (channels, kernel) per layer, encoder and decoder."""


def transformer_big_param_count(vocab: int) -> int:
    """Parameters of ``transformer_vaswani_wmt_en_de_big`` with shared embeddings of ``vocab``."""
    d, ffn, layers = 1024, 4096, 6
    attn = 4 * (d * d + d)
    ff = d * ffn + ffn + ffn * d + d
    enc = layers * (attn + ff + 2 * 2 * d)
    dec = layers * (2 * attn + ff + 3 * 2 * d)
    return vocab * d + enc + dec


# --- model builders (torch imported inside) -------------------------------------------------


def _init_embedding(embedding: torch.nn.Embedding, std: float) -> None:
    """The references' ``Embedding`` helpers: normal(0, std), padding row zero."""
    import torch

    torch.nn.init.normal_(embedding.weight, std=std)
    if embedding.padding_idx is not None:
        with torch.no_grad():
            embedding.weight[embedding.padding_idx].zero_()


def _attention_class() -> type[torch.nn.Module]:
    """Multi-head attention with biased q/k/v/out projections (fairseq and XLM alike), on SDPA."""
    import torch.nn.functional as F
    from torch import nn

    class MultiheadAttention(nn.Module):
        def __init__(self, dim: int, heads: int, dropout: float) -> None:
            super().__init__()
            self.heads, self.dropout = heads, dropout
            self.q_proj = nn.Linear(dim, dim)
            self.k_proj = nn.Linear(dim, dim)
            self.v_proj = nn.Linear(dim, dim)
            self.out_proj = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor, kv: torch.Tensor, causal: bool) -> torch.Tensor:
            b, t, d = x.shape
            s, h = kv.shape[1], self.heads
            q = self.q_proj(x).view(b, t, h, d // h).transpose(1, 2)
            k = self.k_proj(kv).view(b, s, h, d // h).transpose(1, 2)
            v = self.v_proj(kv).view(b, s, h, d // h).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
            )
            out: torch.Tensor = self.out_proj(o.transpose(1, 2).reshape(b, t, d))
            return out

    return MultiheadAttention


def _post_norm_layer_class() -> type[torch.nn.Module]:
    """A post-norm transformer layer: fairseq's (``normalize_before=False``) and XLM's."""
    import torch.nn.functional as F
    from torch import nn

    attention_cls = _attention_class()

    class PostNormLayer(nn.Module):
        def __init__(
            self,
            dim: int,
            ffn: int,
            heads: int,
            *,
            dropout: float,
            attn_dropout: float,
            gelu: bool,
            eps: float,
            cross: bool,
        ) -> None:
            super().__init__()
            self.dropout, self.gelu = dropout, gelu
            self.self_attn = attention_cls(dim, heads, attn_dropout)
            self.self_attn_layer_norm = nn.LayerNorm(dim, eps=eps)
            self.encoder_attn = attention_cls(dim, heads, attn_dropout) if cross else None
            self.encoder_attn_layer_norm = nn.LayerNorm(dim, eps=eps) if cross else None
            self.fc1 = nn.Linear(dim, ffn)
            self.fc2 = nn.Linear(ffn, dim)
            self.final_layer_norm = nn.LayerNorm(dim, eps=eps)

        def forward(self, x: torch.Tensor, enc: torch.Tensor | None) -> torch.Tensor:
            drop = self.dropout if self.training else 0.0
            causal = self.encoder_attn is not None
            x = self.self_attn_layer_norm(x + F.dropout(self.self_attn(x, x, causal), drop))
            if self.encoder_attn is not None and self.encoder_attn_layer_norm is not None:
                assert enc is not None
                x = self.encoder_attn_layer_norm(
                    x + F.dropout(self.encoder_attn(x, enc, False), drop)
                )
            h = self.fc1(x)
            h = F.gelu(h) if self.gelu else F.relu(h)
            out: torch.Tensor = self.final_layer_norm(x + F.dropout(self.fc2(h), drop))
            return out

    return PostNormLayer


def _transformer_big(vocab: int) -> torch.nn.Module:
    """fairseq ``transformer_vaswani_wmt_en_de_big`` with ``--share-all-embeddings``: 6+6
    post-norm layers, d=1024, FFN 4096, 16 heads, dropout 0.3 (attention and ReLU dropout 0),
    sinusoidal positions, embeddings scaled by sqrt(d) and tied to the output projection."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    layer_cls = _post_norm_layer_class()
    d, ffn, heads, layers, dropout = 1024, 4096, 16, 6, 0.3

    def layer(cross: bool) -> nn.Module:
        return layer_cls(
            d, ffn, heads, dropout=dropout, attn_dropout=0.0, gelu=False, eps=1e-5, cross=cross
        )

    class TransformerBig(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, d, padding_idx=FAIRSEQ_PAD)
            self.encoder_layers = nn.ModuleList([layer(False) for _ in range(layers)])
            self.decoder_layers = nn.ModuleList([layer(True) for _ in range(layers)])
            # fairseq's SinusoidalPositionalEmbedding (not a parameter); positions start after pad
            rows = FCONV_MAX_POSITIONS + FAIRSEQ_PAD + 1
            half = d // 2
            freq = torch.exp(
                torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1))
            )
            angle = torch.arange(rows, dtype=torch.float32)[:, None] * freq[None, :]
            table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
            self.register_buffer("positions", table.to(torch.get_default_dtype()), persistent=False)

        def embed(self, tokens: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[1]
            pos = cast("torch.Tensor", self.positions)[FAIRSEQ_PAD + 1 : FAIRSEQ_PAD + 1 + t]
            x = math.sqrt(d) * self.embed_tokens(tokens) + pos
            return F.dropout(x, dropout if self.training else 0.0)

        def forward(
            self, src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor
        ) -> torch.Tensor:
            enc = self.embed(src_tokens)
            for lyr in self.encoder_layers:
                enc = lyr(enc, None)
            x = self.embed(prev_output_tokens)
            for lyr in self.decoder_layers:
                x = lyr(x, enc)
            return F.linear(x, self.embed_tokens.weight)

    model = TransformerBig()
    for module in model.modules():  # fairseq: xavier_uniform weights, zero biases
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    _init_embedding(model.embed_tokens, d**-0.5)
    return model


def _convs2s(src_vocab: int, tgt_vocab: int) -> torch.nn.Module:
    """fairseq ``fconv_wmt_en_de``: embeddings 768 + learned positions, 15 weight-normalised
    GLU conv layers per side (fairseq's ``ConvTBC`` / ``LinearizedConv1d``, here ``conv1d`` on
    (B, C, T) with the same weights and FLOPs), a residual projection where the width changes,
    attention in every decoder layer, decoder output 512 -> vocabulary; dropout 0.2 (the
    fairseq README's WMT'14 en-de command)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    emb, out_emb, dropout = 768, 512, 0.2
    half = math.sqrt(0.5)

    class WNLinear(nn.Module):
        """``nn.utils.weight_norm(nn.Linear)``: weight = g * v / ||v|| per output row."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.weight_v = nn.Parameter(torch.empty(n_out, n_in))
            self.weight_g = nn.Parameter(torch.ones(n_out, 1))
            self.bias = nn.Parameter(torch.zeros(n_out))
            nn.init.normal_(self.weight_v, std=math.sqrt(1.0 / n_in))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, torch._weight_norm(self.weight_v, self.weight_g, 0), self.bias)

    class WNConv(nn.Module):
        """Weight-normalised temporal convolution (``ConvTBC`` / ``LinearizedConv1d``) on
        (B, C, T); ``causal`` pads k-1 on the left only, as the decoder's linearised conv."""

        def __init__(self, n_in: int, n_out: int, k: int, causal: bool) -> None:
            super().__init__()
            self.k, self.causal = k, causal
            self.weight_v = nn.Parameter(torch.empty(n_out, n_in, k))
            self.weight_g = nn.Parameter(torch.ones(n_out, 1, 1))
            self.bias = nn.Parameter(torch.zeros(n_out))
            nn.init.normal_(self.weight_v, std=math.sqrt(4 * (1 - dropout) / (k * n_in)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = torch._weight_norm(self.weight_v, self.weight_g, 0)
            if self.causal:
                t = x.shape[2]
                return F.conv1d(x, w, self.bias, padding=self.k - 1)[:, :, :t]
            return F.conv1d(x, w, self.bias, padding=self.k // 2)

    class GradMultiply(torch.autograd.Function):
        """fairseq's ``GradMultiply``: identity forward, scaled gradient backward."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
            ctx.scale = scale
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return grad * ctx.scale, None

    class AttentionLayer(nn.Module):
        """fairseq ``fconv.AttentionLayer``: dot-product attention over the encoder output,
        keys = encoder output, values = encoder output + source embedding."""

        def __init__(self, channels: int) -> None:
            super().__init__()
            self.in_projection = WNLinear(channels, emb)
            self.out_projection = WNLinear(emb, channels)

        def forward(
            self,
            x: torch.Tensor,
            target_embedding: torch.Tensor,
            keys: torch.Tensor,
            values: torch.Tensor,
        ) -> torch.Tensor:
            residual = x
            x = (self.in_projection(x) + target_embedding) * half
            x = F.softmax(torch.bmm(x, keys), dim=-1)
            s = values.shape[1]
            x = torch.bmm(x, values) * (s * math.sqrt(1.0 / s))
            out: torch.Tensor = (self.out_projection(x) + residual) * half
            return out

    class Stack(nn.Module):
        """``FConvEncoder`` or ``FConvDecoder`` (the decoder's fc3 lives in ``ConvS2S``)."""

        def __init__(self, vocab: int, decoder: bool) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, emb, padding_idx=FAIRSEQ_PAD)
            self.embed_positions = nn.Embedding(FCONV_MAX_POSITIONS, emb, padding_idx=FAIRSEQ_PAD)
            width = FCONV_WMT_EN_DE[0][0]
            self.fc1 = WNLinear(emb, width)
            self.projections = nn.ModuleList()
            self.convolutions = nn.ModuleList()
            self.attention = nn.ModuleList()
            for channels, k in FCONV_WMT_EN_DE:
                self.projections.append(
                    WNLinear(width, channels) if width != channels else nn.Identity()
                )
                self.convolutions.append(WNConv(width, 2 * channels, k, causal=decoder))
                self.attention.append(AttentionLayer(channels) if decoder else nn.Identity())
                width = channels
            self.fc2 = WNLinear(width, out_emb if decoder else emb)

        def embed(self, tokens: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[1]
            pos = torch.arange(FAIRSEQ_PAD + 1, FAIRSEQ_PAD + 1 + t, device=tokens.device)
            x = self.embed_tokens(tokens) + self.embed_positions(pos)
            return F.dropout(x, dropout if self.training else 0.0)

        def forward(
            self,
            tokens: torch.Tensor,
            enc: tuple[torch.Tensor, torch.Tensor] | None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """Embeddings, fc1, the conv stack and fc2, and the input embedding; ``enc`` =
            (keys, values) for the decoder's attention, ``None`` in the encoder."""
            drop = dropout if self.training else 0.0
            embedded = self.embed(tokens)
            x = self.fc1(embedded).transpose(1, 2)  # B x C x T
            for proj, conv, attention in zip(
                self.projections, self.convolutions, self.attention, strict=True
            ):
                residual = proj(x.transpose(1, 2)).transpose(1, 2)
                x = F.glu(conv(F.dropout(x, drop)), dim=1)
                if enc is not None:  # attention in every decoder layer
                    x = attention(x.transpose(1, 2), embedded, *enc).transpose(1, 2)
                x = (x + residual) * half
            out: torch.Tensor = self.fc2(x.transpose(1, 2))  # B x T x C
            return out, embedded

    class ConvS2S(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = Stack(src_vocab, decoder=False)
            self.decoder = Stack(tgt_vocab, decoder=True)
            self.fc3 = WNLinear(out_emb, tgt_vocab)
            self.num_attention_layers = len(FCONV_WMT_EN_DE)

        def forward(
            self, src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor
        ) -> torch.Tensor:
            drop = dropout if self.training else 0.0
            x, src_emb = self.encoder(src_tokens, None)
            scale = 1.0 / (2.0 * self.num_attention_layers)
            a: torch.Tensor = GradMultiply.apply(x, scale)  # type: ignore[no-untyped-call]
            enc = (a.transpose(1, 2), (a + src_emb) * half)
            y, _ = self.decoder(prev_output_tokens, enc)
            logits: torch.Tensor = self.fc3(F.dropout(y, drop))
            return logits

    model = ConvS2S()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            _init_embedding(module, 0.1)
    return model


def _xlm_unmt(vocab: int) -> torch.nn.Module:
    """XLM's ``build_model`` with ``--encoder_only false``: two ``TransformerModel`` (encoder
    and decoder, both ``with_output=True``), each with its own token, learned position (512)
    and language embeddings, an embedding LayerNorm, 6 post-norm layers (d=1024, 8 heads,
    FFN 4096, GELU, dropout 0.1, attention dropout 0.1, LayerNorm eps 1e-12) and a prediction
    layer whose weight is tied to its token embeddings (``share_inout_emb``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    layer_cls = _post_norm_layer_class()
    d, ffn, heads, layers, dropout = 1024, 4096, 8, 6, 0.1

    class TransformerModel(nn.Module):
        def __init__(self, is_decoder: bool) -> None:
            super().__init__()
            self.position_embeddings = nn.Embedding(XLM_MAX_POSITIONS, d)
            self.lang_embeddings = nn.Embedding(XLM_LANGS, d)
            self.embeddings = nn.Embedding(vocab, d, padding_idx=XLM_PAD)
            self.layer_norm_emb = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(
                [
                    layer_cls(
                        d,
                        ffn,
                        heads,
                        dropout=dropout,
                        attn_dropout=dropout,
                        gelu=True,
                        eps=1e-12,
                        cross=is_decoder,
                    )
                    for _ in range(layers)
                ]
            )
            self.pred_layer = nn.Linear(d, vocab)
            self.pred_layer.weight = self.embeddings.weight

        def fwd(
            self, tokens: torch.Tensor, langs: torch.Tensor, src_enc: torch.Tensor | None
        ) -> torch.Tensor:
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embeddings(tokens) + self.position_embeddings(pos)
            x = self.layer_norm_emb(x + self.lang_embeddings(langs))
            x = F.dropout(x, dropout if self.training else 0.0)
            for lyr in self.layers:
                x = lyr(x, src_enc)
            return cast("torch.Tensor", x)

    class UnsupervisedMT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = TransformerModel(is_decoder=False)
            self.decoder = TransformerModel(is_decoder=True)

        def forward(
            self, x1: torch.Tensor, langs1: torch.Tensor, x2: torch.Tensor, langs2: torch.Tensor
        ) -> torch.Tensor:
            """Scores of ``x2[:, 1:]`` given the (noised) ``x1``: XLM's ``mt_step``."""
            enc = self.encoder.fwd(x1, langs1, None)
            dec = self.decoder.fwd(x2, langs2, enc)
            scores: torch.Tensor = self.decoder.pred_layer(dec[:, :-1])
            return scores

    model = UnsupervisedMT()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            _init_embedding(module, d**-0.5)
    return model


# --- workloads ------------------------------------------------------------------------------


def _seq(seq_len: int | None) -> int:
    return seq_len or DEFAULT_SEQ_LEN


def _build_transformer_big(run: RunConfig) -> BuiltWorkload:
    with default_dtype(weight_dtype(run)):
        model = _transformer_big(TRANSFORMER_VOCAB)
    return _seq2seq_workload(model, TRANSFORMER_VOCAB, TRANSFORMER_VOCAB, LABEL_SMOOTHING)


def _build_convs2s(run: RunConfig) -> BuiltWorkload:
    with default_dtype(weight_dtype(run)):
        model = _convs2s(CONVS2S_VOCAB, CONVS2S_VOCAB)
    return _seq2seq_workload(model, CONVS2S_VOCAB, CONVS2S_VOCAB, LABEL_SMOOTHING)


def _seq2seq_workload(
    model: torch.nn.Module, src_vocab: int, tgt_vocab: int, smoothing: float
) -> BuiltWorkload:
    """Supervised fairseq models: label-smoothed cross-entropy over every target token."""

    def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
        import torch

        shape, device = (batch_size, _seq(seq_len)), model_device(model)
        return {
            "src_tokens": torch.randint(FIRST_WORD, src_vocab, shape, device=device),
            "prev_output_tokens": torch.randint(FIRST_WORD, tgt_vocab, shape, device=device),
            "labels": torch.randint(FIRST_WORD, tgt_vocab, shape, device=device),
        }

    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        logits = model(batch["src_tokens"], batch["prev_output_tokens"])
        out: torch.Tensor = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            batch["labels"].reshape(-1),
            ignore_index=FAIRSEQ_PAD,
            label_smoothing=smoothing,
        )
        return out

    return BuiltWorkload(
        model=model,
        make_batch=make_batch,
        loss=loss,
        units_per_sample=_seq,
        fp16_master_weights=True,  # fairseq's --fp16 (FP16Optimizer), as its recipes train
        fused_attention_dropout=False,  # fairseq and XLM of 2019 materialised the scores
    )


def _build_unsupmt(run: RunConfig) -> BuiltWorkload:
    """One denoising auto-encoding step (XLM ``mt_step(lang, lang)``) stands for the whole
    UNMT iteration; see the module's ``unsupmt`` description."""
    with default_dtype(weight_dtype(run)):
        model = _xlm_unmt(XLM_VOCAB)

    def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
        import torch

        shape, device = (batch_size, _seq(seq_len)), model_device(model)
        clean = torch.randint(FIRST_WORD, XLM_VOCAB, shape, device=device)
        langs = torch.zeros(shape, dtype=torch.long, device=device)  # en -> en
        # the noised copy (shuffled, blanked) has the clean one's length here
        noisy = torch.randint(FIRST_WORD, XLM_VOCAB, shape, device=device)
        return {"x1": noisy, "langs1": langs, "x2": clean, "langs2": langs, "labels": clean[:, 1:]}

    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        scores = model(batch["x1"], batch["langs1"], batch["x2"], batch["langs2"])
        out: torch.Tensor = F.cross_entropy(
            scores.reshape(-1, scores.shape[-1]), batch["labels"].reshape(-1)
        )
        return out

    return BuiltWorkload(
        model=model,
        make_batch=make_batch,
        loss=loss,
        units_per_sample=_seq,
        fused_attention_dropout=False,  # fairseq and XLM of 2019 materialised the scores
    )


_INPUT = f"a source and a target sentence of seq_len tokens (default {DEFAULT_SEQ_LEN})"

TRANSFORMER_BIG = Workload(
    info=WorkloadInfo(
        name="transformer-big",
        family="seed_translation",
        task="supervised machine translation (WMT'16 en-de)",
        description=(
            "Transformer (big), fairseq transformer_vaswani_wmt_en_de_big: 6+6 post-norm "
            "layers, d=1024, FFN 4096, 16 heads, dropout 0.3, source/target/output embeddings "
            f"shared over a {TRANSFORMER_VOCAB}-token joined BPE dictionary (fairseq's WMT'16 "
            "en-de recipe), label-smoothed cross-entropy 0.1"
        ),
        input_desc=_INPUT,
        throughput_unit="tokens",
        default_batch_size=32,
        default_seq_len=DEFAULT_SEQ_LEN,
        is_sequence_model=True,
        max_seq_len=FCONV_MAX_POSITIONS,  # the same 1024-row sinusoidal table
        params_published=transformer_big_param_count(TRANSFORMER_VOCAB),
        params_source=(
            "fairseq transformer_vaswani_wmt_en_de_big with --share-all-embeddings at the "
            f"{TRANSFORMER_VOCAB}-token joined dictionary: 209,911,808 (counted from the "
            "architecture). Vaswani et al. 2017, Table 3 prints 213M for big, with the "
            f"paper's {TRANSFORMER_PAPER_VOCAB}-token shared vocabulary (section 5.1); this "
            "model at that vocabulary counts 214,245,376"
        ),
        reference="https://arxiv.org/abs/1706.03762",
    ),
    build=_build_transformer_big,
)

_CONVS2S_PARAMS = 209_569_920
"""Counted from fairseq's ``fconv_wmt_en_de`` with 40,000-entry dictionaries (weight-norm
gains included); the paper prints no parameter count for its WMT'14 en-de model."""

CONVS2S = Workload(
    info=WorkloadInfo(
        name="convs2s",
        family="seed_translation",
        task="supervised machine translation (WMT'14 en-de)",
        description=(
            "Convolutional seq2seq (Gehring et al. 2017), fairseq fconv_wmt_en_de: embeddings "
            "768, 15 weight-normalised GLU conv layers per side (9 x (512, 3), 4 x (1024, 3), "
            "2 x (2048, 1)), attention in every decoder layer, output projection 512, "
            f"{CONVS2S_VOCAB}-entry source and target BPE dictionaries, label-smoothed "
            "cross-entropy 0.1"
        ),
        input_desc=_INPUT,
        throughput_unit="tokens",
        default_batch_size=32,
        default_seq_len=DEFAULT_SEQ_LEN,
        is_sequence_model=True,
        max_seq_len=FCONV_MAX_POSITIONS,
        params_published=_CONVS2S_PARAMS,
        params_source=(
            "fairseq fconv_wmt_en_de (fairseq/models/fconv.py) at 40,000-entry source and "
            "target dictionaries (the paper's 40K BPE types): 209,569,920, counted from the "
            "architecture; Gehring et al. 2017 print no count for the WMT'14 en-de model"
        ),
        reference="https://arxiv.org/abs/1705.03122",
    ),
    build=_build_convs2s,
)

_UNSUPMT_PARAMS = (
    2 * (XLM_VOCAB * 1024 + XLM_MAX_POSITIONS * 1024 + XLM_LANGS * 1024 + 2 * 1024 + XLM_VOCAB)
    + 6 * 12_596_224
    + 6 * 16_796_672
)
"""Encoder and decoder ``TransformerModel`` of XLM: embeddings (token, position, language),
embedding LayerNorm, prediction bias; 6 encoder layers of 12,596,224 and 6 decoder layers of
16,796,672 parameters. 310,047,094 in all."""

UNSUPMT = Workload(
    info=WorkloadInfo(
        name="unsupmt",
        family="seed_translation",
        task="unsupervised machine translation (NewsCrawl en-de)",
        description=(
            "XLM unsupervised MT (Lample & Conneau 2019), en-de: 6-layer encoder and 6-layer "
            "decoder, d=1024, 8 heads, GELU, separate encoder/decoder embeddings over a "
            f"{XLM_VOCAB}-token dictionary (60k BPE codes) with language embeddings. The step "
            "is one denoising auto-encoding loss (XLM mt_step(lang, lang)); the real iteration "
            "adds AE for the other language and two back-translation steps whose greedy "
            "generation has data-dependent lengths, so it is not traced"
        ),
        input_desc=_INPUT,
        throughput_unit="tokens",
        default_batch_size=16,
        default_seq_len=DEFAULT_SEQ_LEN,
        is_sequence_model=True,
        max_seq_len=XLM_MAX_POSITIONS,
        params_published=_UNSUPMT_PARAMS,
        params_source=(
            "facebookresearch/XLM xlm/model/__init__.py build_model (encoder_only false) and "
            "xlm/model/transformer.py TransformerModel, at the en-de dictionary of 64,699 "
            "words (vocab_size of xlm-mlm-ende-1024): 310,047,094, counted from the "
            "architecture; the paper prints no count"
        ),
        reference="https://github.com/facebookresearch/XLM",
    ),
    build=_build_unsupmt,
)

for _workload in (TRANSFORMER_BIG, CONVS2S, UNSUPMT):
    register(_workload)
