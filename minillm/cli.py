"""`python -m minillm generate PROMPT ...`: one generation in the terminal, then its metrics.
`python -m minillm serve [--port 8000] [engine flags]`: the OpenAI-compatible server (chapter 9).
`python -m minillm bench --url ... --rate 2 4 8`: load-test any OpenAI-compatible server (chapter 9)."""

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
    _add_serve(commands)
    _add_bench(commands)
    return parser


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="load-test an OpenAI-compatible server (chapter 9)")
    bench.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the API's base URL (default: a local serve)")
    bench.add_argument("--model", default="minillm-target", help="the model name the server serves")
    bench.add_argument("--rate", type=_ranged(float, 0, inclusive=False), nargs="+", default=[float("inf")],
                       help="requests per second, Poisson arrivals; several for a sweep; inf: all at once")
    bench.add_argument("--num-prompts", type=_ranged(int, 1), default=100)
    bench.add_argument("--max-tokens", type=_ranged(int, 1), default=64)
    bench.add_argument("--ignore-eos", action="store_true", help="ask for exactly --max-tokens (minillm, vLLM)")
    bench.add_argument("--prompts-file", default=None, help="a text file to cut prompts from (default: the held-out "
                                                            "sample shipped with the course)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--slo-ttft", type=_ranged(float, 0, inclusive=False), default=1.0,
                       help="goodput: TTFT limit in seconds")
    bench.add_argument("--slo-tpot", type=_ranged(float, 0, inclusive=False), default=0.1,
                       help="goodput: TPOT limit in seconds")
    bench.add_argument("--request-timeout", type=_ranged(float, 0, inclusive=False), default=600.0,
                       help="a request not finished this many seconds after it was sent fails (default 600)")
    bench.add_argument("--duration", type=_ranged(float, 0, inclusive=False), default=None,
                       help="send no request whose arrival is later than this many seconds after a rate's start "
                            "(default: --request-timeout); a rate then ends within duration + request timeout")
    bench.add_argument("--api-key", default=None)
    bench.add_argument("--out", default=None, help="write OUT.json (after each rate) and OUT.png")


def bench(args) -> int:
    import json
    from pathlib import Path

    from minillm import ASSETS_DIR
    from minillm.loadgen import Slo, plot, prompts_from_text, read_prompts_file, sweep

    text_file = Path(args.prompts_file) if args.prompts_file else ASSETS_DIR / "heldout_sample.txt"
    try:
        text = read_prompts_file(text_file)  # a FIFO or a device is refused, not read forever
        prompts_from_text(text, 1, args.seed)  # enough text to cut prompts from?
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"minillm: error: --prompts-file {text_file}: {err}", file=sys.stderr)
        return USAGE_ERROR
    out = None
    if args.out:
        out = Path(args.out[: -len(".json")] if args.out.endswith(".json") else args.out)
        try:  # before the run, not after it: a path that cannot be written loses nothing
            Path(f"{out}.json").write_text("[]\n")
        except OSError as err:
            print(f"minillm: error: --out {args.out}: cannot write {out}.json ({err.strerror or err})",
                  file=sys.stderr)
            return USAGE_ERROR

    def save(results: list[dict]) -> None:  # after every rate: an interrupted sweep keeps the finished ones
        if out is not None:
            rows = [r | {"rate": "inf" if r["rate"] == float("inf") else r["rate"]} for r in results]
            Path(f"{out}.json").write_text(json.dumps(rows, indent=2) + "\n")

    try:
        results = sweep(args.url, args.model, args.rate, args.num_prompts, args.max_tokens, args.seed,
                        Slo(args.slo_ttft, args.slo_tpot), text, args.api_key,
                        {"ignore_eos": True} if args.ignore_eos else None, request_timeout=args.request_timeout,
                        on_rate=save, duration=args.duration)
    except KeyboardInterrupt:
        saved = json.loads(Path(f"{out}.json").read_text()) if out is not None else []
        where = f" (saved in {out}.json)" if saved else ""
        print(f"\ninterrupted: {len(saved)} of {len(args.rate)} rates finished{where}", file=sys.stderr)
        return 130
    for r in results:
        ms = lambda d: "/".join("-" if v is None else f"{1e3 * v:.0f}" for v in d.values())  # noqa: E731
        print(f"rate {r['rate']:g}/s: {r['completed']}/{r['requests']} ok, {r['request_throughput']:.2f} req/s, "
              f"{r['output_token_throughput']:.0f} tok/s, goodput {r['goodput']:.2f} req/s; TTFT p50/p90/p99 "
              f"{ms(r['ttft_s'])} ms, TPOT {ms(r['tpot_s'])} ms, ITL {ms(r['itl_s'])} ms")
        for error in r["errors"]:
            print(f"  error: {error}")
        if r["not_sent"]:
            duration = args.request_timeout if args.duration is None else args.duration
            print(f"  not sent: {r['not_sent']} of {r['not_sent'] + r['requests']} requests, whose arrivals fell "
                  f"after the run's {duration:g} s (--duration)")
    if out is not None:
        plot(results, Path(f"{out}.png"))
        print(f"wrote {out}.json and {out}.png")
    failed = sum(r["failed"] for r in results)
    if failed:
        print(f"minillm: {failed} of {sum(r['requests'] for r in results)} requests failed", file=sys.stderr)
    return 1 if failed else 0


def _add_serve(commands) -> None:
    serve = commands.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (chapter 9)")
    serve.add_argument("--model", default=None, help="checkpoint folder, shipped model name or hub id; default: target")
    serve.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model or "
                                                                 "'minillm-target')")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=_ranged(int, 0, 65535), default=8000, help="port (default 8000)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route but /health and /metrics")
    serve.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                       help="let browser pages from these origins call the API (CORS; '*' for any); off by default")
    serve.add_argument("--default-max-tokens", type=_ranged(int, 1), default=16,
                       help="max_tokens when a request gives none")
    engine = serve.add_argument_group("engine (chapters 2-12)")
    engine.add_argument("--batching", choices=("static", "continuous"), default="continuous")
    engine.add_argument("--max-num-seqs", type=int, default=16, help="requests running at once")
    engine.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    engine.add_argument("--max-tokens-per-step", type=int, default=8192, help="token budget of one step")
    engine.add_argument("--kv", choices=("contiguous", "paged"), default="paged")
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--kv-cache-bytes", type=int, default=None)
    engine.add_argument("--prefix-cache", action="store_true")
    engine.add_argument("--chunked-prefill", action="store_true")
    engine.add_argument("--max-tokens-per-prefill-chunk", type=int, default=128)
    engine.add_argument("--speculative", choices=("draft", "ngram"), default=None)
    engine.add_argument("--num-speculative-tokens", type=int, default=4)
    engine.add_argument("--jump-forward", action="store_true",
                        help="structured outputs: text the grammar forces is appended unsampled (chapter 11)")
    engine.add_argument("--quantization", choices=("int8", "int4"), default=None,
                        help="weight-only quantization of the linear layers, applied at load (chapter 12)")
    engine.add_argument("--quantization-group-size", type=int, default=64, choices=(32, 64, 128),
                        help="int4: inputs sharing a scale (default 64)")
    engine.add_argument("--kv-cache-dtype", choices=("auto", "int8", "fp8"), default="auto",
                        help="the paged KV cache as int8 (a scale per token and head) or fp8 codes (chapter 12)")
    engine.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="ranks sharing each layer, as worker processes on this machine (chapter 13)")
    engine.add_argument("--disaggregate", action="store_true",
                        help="prefill and decode in two engine core processes, the prompts' K/V sent from one to the "
                             "other (chapter 13; the K/V arrive as prefix-cache blocks: turns --prefix-cache on)")
    engine.add_argument("--compile", action="store_true", help="compiled decode steps (CPU or GPU)")
    engine.add_argument("--cuda-graphs", action="store_true", help="CUDA Graphs for decode steps (GPU)")
    engine.add_argument("--device", default=None, type=_device)
    engine.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    engine.add_argument("--engine-core", choices=("process", "thread"), default="process",
                        help="where the engine steps: a process of its own (default; chapter 10), or a thread of "
                             "the server's process (chapter 9)")
    engine.add_argument("--core-threads", type=_ranged(int, 1), default=None,
                        help="torch threads of the engine core process (default: torch's, one per core)")
    engine.add_argument("--trace-steps", type=_ranged(int, 1), default=64,
                        help="steps the engine's trace keeps for widgets and tests (default 64: a server's trace "
                             "would otherwise hold every running request's block table for thousands of steps)")


def engine_config(args):
    """The EngineConfig the serve flags ask for (a ValueError names a bad combination)."""
    from minillm.config import EngineConfig, SpeculativeConfig

    spec = SpeculativeConfig(args.speculative, args.num_speculative_tokens) if args.speculative else None
    return EngineConfig(batching=args.batching, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        max_tokens_per_step=args.max_tokens_per_step, kv=args.kv, block_size=args.block_size,
                        kv_cache_bytes=args.kv_cache_bytes, prefix_cache=args.prefix_cache or args.disaggregate,
                        chunked_prefill=args.chunked_prefill,
                        max_tokens_per_prefill_chunk=args.max_tokens_per_prefill_chunk, speculative=spec,
                        jump_forward=args.jump_forward, compile=args.compile, cuda_graphs=args.cuda_graphs,
                        device=None if args.device is None else str(args.device), dtype=args.dtype,
                        quantization=args.quantization, quantization_group_size=args.quantization_group_size,
                        kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size,
                        trace_max_steps=args.trace_steps)


def serve(args) -> int:
    try:
        import uvicorn  # noqa: F401

        from minillm.async_engine import AsyncLLM
        from minillm.engine_core import ProcessAsyncLLM
        from minillm.server import build_app
    except ImportError as err:
        print(f"minillm: error: serving needs the 'serve' extra (pip install -e '.[serve]'): {err}", file=sys.stderr)
        return USAGE_ERROR
    try:  # bound before the model loads: a port in use is said at once, and --port 0 learns its port
        sock = _bind(args.host, args.port)
    except OSError as err:
        print(f"minillm: error: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return USAGE_ERROR
    with sock:
        try:
            if args.disaggregate:  # a prefill core and a decode core, the server routing between them
                from minillm.disagg.router import DisaggregatedLLM

                llm = DisaggregatedLLM(args.model, engine_config(args), threads=(args.core_threads, args.core_threads))
            elif args.engine_core == "process":
                from minillm.engine_core import ProcessAsyncLLM

                llm = ProcessAsyncLLM(args.model, engine_config(args), threads=args.core_threads)
            else:
                llm = AsyncLLM(args.model, engine_config(args))
        except (ValueError, FileNotFoundError, OSError, RuntimeError) as err:
            print(f"minillm: error: {err}", file=sys.stderr)
            return USAGE_ERROR
        name = args.served_model_name or args.model or "minillm-target"
        app = build_app(llm, name, api_key=args.api_key, default_max_tokens=args.default_max_tokens,
                        cors_origins=args.allowed_origins)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
        try:
            _run_server(app, sock, f"serving {name!r} on {url} (OpenAI-compatible; Ctrl-C stops)")
        finally:
            if isinstance(llm, ProcessAsyncLLM):
                llm.close()
    return 0


def _bind(host: str, port: int):
    """A TCP socket bound to (host, port) — port 0: one the system picks — not yet listening."""
    import socket

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform != "win32":  # as uvicorn does: a restart need not wait for TIME_WAIT
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _run_server(app, sock, announce: str) -> None:
    """uvicorn on `sock`; `announce` is printed once it listens (not before: a client may connect then)."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(announce, flush=True)

    AnnouncingServer(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _ranged(kind, low, high=None, inclusive: bool = True):
    """An argparse type: `kind`, at least `low` (more than it, unless `inclusive`), at most `high`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value != value or value < low or (value == low and not inclusive) or (high is not None and value > high):
            bound = f"{'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


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
    if args.command == "serve":
        return serve(args)
    if args.command == "bench":
        return bench(args)
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
