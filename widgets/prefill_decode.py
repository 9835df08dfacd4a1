"""Prefill vs decode: what one forward step computes, what it reads, and which resource bounds it.

`step_cost()` is a pure roofline estimate for a dense decoder; `render_step_cost()` turns it into
HTML; `PrefillDecodeWidget` wires both to a toggle and sliders in the notebook.

    arithmetic intensity = FLOPs / bytes moved        ridge point = peak FLOP/s / memory bandwidth
    intensity < ridge -> memory-bound (decode)        intensity > ridge -> compute-bound (prefill)
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as W

from widgets.animation import StillFallback


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s at the dtype used
    bandwidth: float  # bytes/s of main memory

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth


HARDWARE = {
    "laptop CPU (fp32)": Hardware("laptop CPU (fp32)", 0.3e12, 50e9),
    "NVIDIA H200 (bf16)": Hardware("NVIDIA H200 (bf16)", 989e12, 4.8e12),
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bytes_per_param: int

    @classmethod
    def from_config(cls, name: str, config, bytes_per_param: int = 4) -> ModelShape:
        return cls(name, config.hidden_size, config.intermediate_size, config.num_layers, config.num_heads,
                   config.num_kv_heads, config.head_dim, config.vocab_size, bytes_per_param)


MODELS = {
    "Llama-3-8B (bf16)": ModelShape("Llama-3-8B (bf16)", 4096, 14336, 32, 32, 8, 128, 128256, 2),
    "Qwen3-0.6B (bf16)": ModelShape("Qwen3-0.6B (bf16)", 1024, 3072, 28, 16, 8, 128, 151936, 2),
}


def step_cost(m: ModelShape, phase: str, batch: int, prompt_len: int, context_len: int, hw: Hardware) -> dict:
    """Roofline numbers of one forward step.

    prefill: `batch` sequences of `prompt_len` new tokens each.
    decode:  `batch` sequences of 1 new token each, attending to `context_len` cached tokens.
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    per_layer = {"qkv_proj": (m.hidden, q + 2 * kv), "o_proj": (q, m.hidden),
                 "gate_up_proj": (m.hidden, 2 * m.intermediate), "down_proj": (m.intermediate, m.hidden)}
    layer_params = sum(a * b for a, b in per_layer.values())
    weight_params = m.layers * layer_params + m.vocab * m.hidden  # + LM head
    tokens = batch * (prompt_len if phase == "prefill" else 1)
    kv_bytes_per_token = 2 * m.layers * kv * m.bytes_per_param
    if phase == "prefill":
        attn_flops = 2 * 2 * batch * m.layers * q * prompt_len * (prompt_len + 1) / 2  # causal: QK^T and PV
        kv_bytes = tokens * kv_bytes_per_token  # written once
        attended = prompt_len
    else:
        attn_flops = 2 * 2 * batch * m.layers * q * (context_len + 1)
        kv_bytes = batch * (context_len + 1) * kv_bytes_per_token  # the whole cache is read
        attended = context_len + 1
    matmul_flops = 2 * tokens * m.layers * layer_params + 2 * batch * m.vocab * m.hidden  # logits: last rows only
    flops = matmul_flops + attn_flops
    weight_bytes = weight_params * m.bytes_per_param  # read once per step, whatever the batch
    moved = weight_bytes + kv_bytes
    intensity = flops / moved
    shapes = [(name, f"[{tokens} × {a}] @ [{a} × {b}]") for name, (a, b) in per_layer.items()]
    queries = prompt_len if phase == "prefill" else 1
    attention_shape = f"[{queries} × {m.head_dim}] @ [{m.head_dim} × {attended}]"
    shapes.append(("attention (per sequence, layer and head)", attention_shape))
    shapes.append(("lm_head (each sequence's last token)", f"[{batch} × {m.hidden}] @ [{m.hidden} × {m.vocab}]"))
    return {
        "phase": phase, "tokens": tokens, "flops": flops, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
        "bytes": moved, "intensity": intensity, "ridge": hw.ridge,
        "bound": "compute" if intensity > hw.ridge else "memory bandwidth",
        "time_s": max(flops / hw.peak_flops, moved / hw.bandwidth), "shapes": shapes,
    }


def _fmt(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def render_step_cost(cost: dict) -> str:
    """HTML for one step: matrix shapes, FLOPs, bytes read, intensity and the bound."""
    colour = "#c0392b" if cost["bound"].startswith("memory") else "#27ae60"
    rows = "".join(f"<tr><td>{n}</td><td><code>{s}</code></td></tr>" for n, s in cost["shapes"])
    return (
        f"<div class='prefill-decode'><b>{cost['phase']}</b>: {cost['tokens']} new token(s) in this step"
        f"<table>{rows}</table>"
        f"<table><tr><td>FLOPs</td><td>{_fmt(cost['flops'], 'FLOP')}</td></tr>"
        f"<tr><td>weights read</td><td>{_fmt(cost['weight_bytes'], 'B')}</td></tr>"
        f"<tr><td>KV cache {'written' if cost['phase'] == 'prefill' else 'read'}</td>"
        f"<td>{_fmt(cost['kv_bytes'], 'B')}</td></tr>"
        f"<tr><td>arithmetic intensity</td><td>{cost['intensity']:.1f} FLOP/byte "
        f"(ridge point {cost['ridge']:.0f})</td></tr>"
        f"<tr><td>bound by</td><td style='color:{colour}'><b>{cost['bound']}</b></td></tr>"
        f"<tr><td>roofline time</td><td>{cost['time_s'] * 1e3:.3f} ms</td></tr></table></div>"
    )


class PrefillDecodeWidget(StillFallback, W.VBox):
    """Toggle prefill/decode, move the sliders, watch the bound change."""

    def __init__(self, models: dict[str, ModelShape], hardware: dict[str, Hardware] = HARDWARE):
        self.models, self.hardware = models, hardware
        self.phase = W.ToggleButtons(options=["prefill", "decode"], value="prefill", description="phase")
        self.model = W.Dropdown(options=list(models), description="model")
        self.hw = W.Dropdown(options=list(hardware), description="hardware")
        self.batch = W.IntSlider(value=1, min=1, max=256, description="batch")
        self.prompt_len = W.IntSlider(value=512, min=1, max=8192, step=1, description="prompt len")
        self.context_len = W.IntSlider(value=512, min=0, max=8192, description="context len")
        self.out = W.HTML()
        for control in (self.phase, self.model, self.hw, self.batch, self.prompt_len, self.context_len):
            control.observe(lambda _: self.refresh(), names="value")
        super().__init__([W.HBox([self.phase, self.model, self.hw]),
                          W.HBox([self.batch, self.prompt_len, self.context_len]), self.out])
        self.refresh()

    def refresh(self) -> None:
        cost = step_cost(self.models[self.model.value], self.phase.value, self.batch.value,
                         self.prompt_len.value, self.context_len.value, self.hardware[self.hw.value])
        self.out.value = render_step_cost(cost)

    def still_html(self) -> str:
        settings = (f"{self.phase.value}, {self.model.value} on {self.hw.value}, batch {self.batch.value}, "
                    f"prompt {self.prompt_len.value}, context {self.context_len.value}")
        return f"<p><b>{html.escape(settings)}</b></p>{self.out.value}"
