"""`python -m minillm generate PROMPT ...`: one generation in the terminal, then its metrics."""

from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        print(f"minillm: error: {message}", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m minillm", description="minillm: a small, readable LLM inference engine.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = commands.add_parser("generate", help="generate a continuation of PROMPT and print its metrics")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--model", default=None,
                     help="checkpoint folder, shipped model name (target, draft) or hub id; default: target")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="at most this many new tokens (default 64)")
    gen.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1.0)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (default: all)")
    gen.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated")
    gen.add_argument("--no-kv-cache", action="store_true", help="use chapter 1's naive loop without a KV cache")
    gen.add_argument("--device", default=None, type=_device, help="cpu, cuda or cuda:N (default: cuda when available)")
    return parser


def _device(name: str):
    from minillm.model.loader import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def format_metrics(out) -> str:
    m = out.metrics
    parts = [f"{m.num_tokens} tokens", f"finish: {out.finish_reason}", f"TTFT {m.ttft * 1e3:.1f} ms"]
    if m.tpot is not None:
        parts += [f"TPOT {m.tpot * 1e3:.1f} ms", f"{1 / m.tpot:.0f} tok/s after the first"]
    return " · ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from minillm.generate import generate
    from minillm.model import load
    from minillm.sampling import SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_new_tokens=args.max_new_tokens, seed=args.seed, ignore_eos=args.ignore_eos)
        model, tokenizer = load(args.model, device=args.device)
        on_text = (lambda delta: print(delta, end="", flush=True)) if args.stream else None
        out = generate(model, tokenizer, args.prompt, params, kv_cache=not args.no_kv_cache, on_text=on_text)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"minillm: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    print("" if args.stream else out.text)
    print(f"\n[{format_metrics(out)}]")
    return 0
