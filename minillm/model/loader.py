"""Load Hugging Face checkpoints (Llama, Qwen2, Qwen3) into minillm's own `CausalLM`.

A checkpoint is a folder with `config.json`, one `model.safetensors` or shards listed in
`model.safetensors.index.json`, and tokenizer files; or a hub id, downloaded when online.
HF keeps q/k/v and gate/up as separate matrices; minillm fuses them, so the loader stacks them:

    qkv_proj.weight     = cat(q_proj.weight, k_proj.weight, v_proj.weight)   # rows
    gate_up_proj.weight = cat(gate_proj.weight, up_proj.weight)

The model is built on uninitialised memory, so a checkpoint that does not fill every row of it is refused:
a missing or unexpected tensor, a wrong shape, a dtype that is not floating-point, NaN or inf values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minillm.model.config import ModelConfig
from minillm.model.decoder import CausalLM

SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "assets"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_SHARDS = {"qkv_proj": 3, "gate_up_proj": 2}  # fused parameter -> how many checkpoint tensors it stacks
# The one tensor transformers ignores on load for Llama/Qwen2/Qwen3 (modeling_utils.py,
# `_adjust_missing_and_unexpected_keys`): old Llama checkpoints stored each layer's RoPE inverse frequencies,
# which are recomputed from the config.
_IGNORED = re.compile(r"rotary_emb\.inv_freq")
MAX_LISTED = 8  # tensor names quoted in one error message


def resolve_checkpoint(model: str | Path | None) -> Path:
    """A local folder, a shipped model name ("target", "draft"), or a hub id (needs the network)."""
    if model is None:
        model = "target"
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face checkpoint folder")
        return path
    if (SHIPPED_MODELS / str(model) / "config.json").is_file():
        return SHIPPED_MODELS / str(model)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", str(model)):
        return _download(str(model))
    raise FileNotFoundError(f"model {str(model)!r} is not a folder, a shipped model (target, draft) or a hub id")


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as err:  # offline, unknown repo, gated repo...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FileNotFoundError(f"could not fetch {repo_id!r} from the hub: {reason}") from err


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable JSON file: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(data).__name__}")
    return data


def read_config(path: Path) -> ModelConfig:
    hf = _read_json(path / "config.json")
    eos: tuple[int, ...] = ()
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen_eos = _read_json(gen_path).get("eos_token_id")
        eos = (gen_eos,) if not isinstance(gen_eos, list | None) else tuple(gen_eos or ())
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in eos):
            raise ValueError(f"{gen_path}: eos_token_id must be a token id or a list of them, got {gen_eos!r}")
    try:
        return ModelConfig.from_hf(hf, eos_token_ids=eos)
    except (KeyError, TypeError, ValueError, ArithmeticError) as err:
        raise ValueError(f"{path / 'config.json'} does not describe a supported model: "
                         f"{type(err).__name__}: {err}") from None


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The device to run on (None: cuda when available, else cpu); a clear ValueError for a name
    torch does not know or a GPU this machine does not have."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(device)!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(device)!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} asked for, but this torch sees no CUDA GPU "
                             f"(torch {torch.__version__}; use device='cpu')")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} asked for, but there are {torch.cuda.device_count()} GPUs")
    return device


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(f"{index} has no weight_map of tensor names to file names")
        files = [path / shard for shard in sorted(set(weight_map.values()))]
        outside = [f for f in files if not f.resolve().is_relative_to(path.resolve())]
        if outside:
            raise ValueError(f"{index} points outside its folder: {outside[0]}")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")


def default_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """float32 on CPU (fast and exact there); the checkpoint's own dtype on an accelerator."""
    return torch.float32 if device.type == "cpu" else DTYPES.get(config.dtype, torch.bfloat16)


@torch.no_grad()
def load_weights(model: CausalLM, folder: Path, files: list[Path]) -> None:
    """Copy every tensor of the checkpoint in `folder` (its safetensors `files`) into the model, fusing q/k/v and
    gate/up. Refuses, naming the tensors: missing ones (every shard of a fused parameter counts), unexpected ones,
    a name stored twice, a wrong shape, a dtype that is not floating-point, and NaN or inf values."""
    plan, tied_head = _plan(model, folder, _checkpoint_keys(folder, files))
    params = dict(model.named_parameters())
    for file in files:
        names = [name for name, (where, _, _) in plan.items() if where == file]
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    _, target, shard = plan[name]
                    param = params[target]
                    dest = param if shard is None else param[_shard_rows(model.config, target, shard)]
                    _copy_checked(f.get_tensor(name), dest, name, folder)
        except (OSError, SafetensorError, RuntimeError) as err:  # unreadable or corrupt file
            raise ValueError(f"{file} could not be loaded: {type(err).__name__}: {err}") from None
    if tied_head is not None:
        _check_tied_head(model, folder, *tied_head)


def _checkpoint_keys(folder: Path, files: list[Path]) -> dict[str, Path]:
    """Every tensor name in the checkpoint -> the file holding it; a name in two files is refused."""
    where: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                names = list(f.keys())
        except (OSError, SafetensorError) as err:
            raise ValueError(f"{file} could not be loaded: {type(err).__name__}: {err}") from None
        for name in names:
            if name in where:
                raise ValueError(f"checkpoint {folder}: tensor {name!r} is stored twice "
                                 f"({where[name].name} and {file.name})")
            where[name] = file
    return where


def _plan(model: CausalLM, folder: Path, where: dict[str, Path]
          ) -> tuple[dict[str, tuple[Path, str, int | None]], tuple[Path, str] | None]:
    """checkpoint name -> (file, parameter, shard) for every tensor to load, and, for a tied model whose checkpoint
    also stores lm_head.weight beside the embeddings, that tensor's (file, name) to compare once loaded.

    Mirrors transformers' `from_pretrained` for these families: `rotary_emb.inv_freq` (stored by old Llama
    checkpoints, recomputed from the config) is ignored; under tie_word_embeddings an lm_head.weight stands in for
    missing embeddings (HF ties symmetrically) and must otherwise equal them (HF would untie: the config is wrong)."""
    wanted = {key: _checkpoint_name(*key) for key in _expected_keys(model)}
    tied = model.lm_head is None
    has_embed = any(_target_name(n) == ("embed_tokens.weight", None) for n in where)
    plan: dict[str, tuple[Path, str, int | None]] = {}
    found: dict[tuple[str, int | None], str] = {}
    unexpected: list[str] = []
    tied_head = None
    for name, file in where.items():
        if _IGNORED.search(name):
            continue
        key = _target_name(name)
        if tied and key == ("lm_head.weight", None):
            if has_embed:
                tied_head = (file, name)
                continue
            key = ("embed_tokens.weight", None)
        if key not in wanted:
            unexpected.append(name)
            continue
        if key in found:
            raise ValueError(f"checkpoint {folder}: tensors {found[key]!r} and {name!r} both hold {wanted[key]!r}")
        found[key] = name
        plan[name] = (file, *key)
    missing = [hf_name for key, hf_name in wanted.items() if key not in found]
    if missing or unexpected:
        problems = [f"{what} {len(names)} tensor{'s' * (len(names) > 1)}{why}: {_listed(names)}"
                    for what, why, names in (("it lacks", "", missing),
                                             ("it has", " the model has no place for", unexpected)) if names]
        raise ValueError(f"checkpoint {folder} does not fit the model: {'; '.join(problems)}")
    return plan, tied_head


def _expected_keys(model: CausalLM) -> list[tuple[str, int | None]]:
    """(parameter, shard) for every tensor the checkpoint must provide; shard None for an unfused parameter."""
    keys: list[tuple[str, int | None]] = []
    for name, _ in model.named_parameters():
        shards = _SHARDS.get(name.split(".")[-2], 0)
        keys += [(name, shard) for shard in range(shards)] if shards else [(name, None)]
    return keys


def _checkpoint_name(target: str, shard: int | None) -> str:
    """('layers.3.self_attn.qkv_proj.weight', 1) -> 'model.layers.3.self_attn.k_proj.weight'."""
    if shard is not None:
        fused = target.split(".")[-2]
        hf_part = next(hf for hf, (ours, i) in _FUSED.items() if ours == fused and i == shard)
        target = target.replace(f".{fused}.", f".{hf_part}.")
    return target if target.startswith("lm_head.") else f"model.{target}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" ... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _copy_checked(tensor: torch.Tensor, dest: torch.Tensor, name: str, folder: Path) -> None:
    """dest <- tensor (casting between floating dtypes), refusing a wrong shape or dtype and NaN/inf values."""
    if tensor.shape != dest.shape:  # copy_ would broadcast a (1,) tensor over a whole matrix
        raise ValueError(f"checkpoint {folder}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                         f"the model needs {tuple(dest.shape)}")
    if not tensor.is_floating_point():
        raise ValueError(f"checkpoint {folder}: tensor {name!r} is {tensor.dtype}, not a floating-point type")
    dest.copy_(tensor)
    if not torch.isfinite(dest).all():  # checked on the model's device: fast there
        if not torch.isfinite(tensor).all():
            raise ValueError(f"checkpoint {folder}: tensor {name!r} holds NaN or inf values")
        raise ValueError(f"checkpoint {folder}: tensor {name!r} overflows {dest.dtype} (its values reach "
                         f"{tensor.abs().max().item():.3g}); load it in a wider dtype")


def _check_tied_head(model: CausalLM, folder: Path, file: Path, name: str) -> None:
    """A tied model may find lm_head.weight beside the embeddings only as an equal copy of them."""
    with safe_open(str(file), framework="pt") as f:
        head = f.get_tensor(name)
    embed = model.embed_tokens.weight
    if head.shape != embed.shape or not torch.equal(head.to(embed.device, embed.dtype), embed):
        raise ValueError(f"checkpoint {folder}: config.json ties the LM head to the embeddings (tie_word_embeddings) "
                         f"but tensor {name!r} differs from model.embed_tokens.weight; transformers would untie them, "
                         f"so set tie_word_embeddings to false in config.json if the checkpoint is right")


def _target_name(hf_name: str) -> tuple[str, int | None]:
    """'model.layers.3.self_attn.k_proj.weight' -> ('layers.3.self_attn.qkv_proj.weight', 1)."""
    name = hf_name.removeprefix("model.")
    for hf_part, (ours, shard) in _FUSED.items():
        if f".{hf_part}." in name:
            return name.replace(f".{hf_part}.", f".{ours}."), shard
    return name, None


def _shard_rows(config: ModelConfig, target: str, shard: int) -> slice:
    if ".qkv_proj." in target:
        sizes = [config.q_size, config.kv_size, config.kv_size]
    else:
        sizes = [config.intermediate_size, config.intermediate_size]
    start = sum(sizes[:shard])
    return slice(start, start + sizes[shard])


def load_model(model: str | Path | None = None, dtype: torch.dtype | str | None = None,
               device: torch.device | str | None = None) -> CausalLM:
    """Build minillm's `CausalLM` from a checkpoint (default: the shipped target)."""
    path = resolve_checkpoint(model)
    config = read_config(path)
    device = resolve_device(device)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    dtype = dtype or default_dtype(config, device)
    try:
        with torch.device("meta"):
            net = CausalLM(config)
        net = net.to_empty(device=device).to(dtype)
        net.rope.compute_tables()  # buffers made on the meta device hold no values yet
    except (RuntimeError, MemoryError) as err:  # e.g. a context too long to hold the RoPE tables
        raise ValueError(f"the model {path / 'config.json'} describes could not be built: {err}") from None
    load_weights(net, path, _checkpoint_files(path))
    return net.eval()


def load_tokenizer(model: str | Path | None = None):
    """The checkpoint's tokenizer, through transformers' AutoTokenizer (offline for local folders)."""
    from transformers import AutoTokenizer

    path = resolve_checkpoint(model)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as err:  # transformers raises many types for a broken tokenizer folder
        raise ValueError(f"the tokenizer in {path} could not be loaded: {type(err).__name__}: {err}") from None


def load(model: str | Path | None = None, dtype: torch.dtype | str | None = None,
         device: torch.device | str | None = None):
    """(model, tokenizer); with no argument, the course's shipped target model. Refuses a tokenizer
    that knows far fewer tokens than the model has (its files are probably missing)."""
    net, tokenizer = load_model(model, dtype, device), load_tokenizer(model)
    if len(tokenizer) < net.config.vocab_size // 2:
        raise ValueError(f"the tokenizer in {resolve_checkpoint(model)} knows {len(tokenizer)} tokens but the model "
                         f"has {net.config.vocab_size}: is tokenizer.json missing?")
    return net, tokenizer
