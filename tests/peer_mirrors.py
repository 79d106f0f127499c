"""Stand-ins for the peers' SAE classes where the library is not installed in the test venv (sae_lens, sparsify,
dictionary_learning): each mirrors the attribute layout its source defines (names, shapes, config objects and
the save hooks the conversion uses) and carries the library's own encode, transcribed from its source, as the
reference the conversion is compared against.

  SAELens 6.18  sae_lens/saes/sae.py (SAEMetadata, SAEConfig.to_dict, process_state_dict_for_saving*),
                topk_sae.py (TopK: topk of hidden_pre, then ReLU), jumprelu_sae.py (ReLU(pre)·[pre > threshold]),
                standard_sae.py (ReLU), batchtopk_sae.py (topk_threshold buffer; saved for inference as jumprelu
                with the threshold broadcast to every latent, get_inference_sae_cfg_dict)
  sparsify      sparsify/sparse_coder.py (SparseCoder: cfg, d_in, num_latents, encoder nn.Linear, W_dec, b_dec,
                W_skip; encode relu(encoder(x − b_dec)) then top-k), sparsify/config.py (SparseCoderConfig)
  dictionary_learning  dictionary.py (AutoEncoder: encoder, decoder (no bias), bias; AutoEncoderTopK: encoder,
                decoder, b_dec, k and threshold buffers, relu(encoder(x − b_dec)) then top-k)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn


# ----------------------------------------------------------------------------- SAELens 6
class SAEMetadata:
    def __init__(self, **kwargs):
        self.sae_lens_version = kwargs.pop("sae_lens_version", "6.18.0")
        self.sae_lens_training_version = kwargs.pop("sae_lens_training_version", "6.18.0")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __getattr__(self, name):
        return None

    def to_dict(self):
        return self.__dict__.copy()


@dataclass
class SAEConfig:
    d_in: int
    d_sae: int
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    reshape_activations: str = "none"
    metadata: SAEMetadata = field(default_factory=SAEMetadata)

    def to_dict(self):
        res = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        res["metadata"] = self.metadata.to_dict()
        res["architecture"] = self.architecture()
        return res


@dataclass
class StandardSAEConfig(SAEConfig):
    @classmethod
    def architecture(cls):
        return "standard"


@dataclass
class TopKSAEConfig(SAEConfig):
    k: int = 100
    rescale_acts_by_decoder_norm: bool = False

    @classmethod
    def architecture(cls):
        return "topk"


@dataclass
class JumpReLUSAEConfig(SAEConfig):
    @classmethod
    def architecture(cls):
        return "jumprelu"


@dataclass
class BatchTopKTrainingSAEConfig(TopKSAEConfig):
    topk_threshold_lr: float = 0.01

    @classmethod
    def architecture(cls):
        return "batchtopk"

    def get_inference_sae_cfg_dict(self):
        names = {f.name for f in dataclasses.fields(JumpReLUSAEConfig)}
        out = {name: getattr(self, name) for name in names}
        out["architecture"] = "jumprelu"
        out["metadata"] = self.metadata.to_dict()
        return out


class _SAELensSAE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.d_in))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in))

    def randomize(self, seed: int) -> _SAELensSAE:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return self

    def process_state_dict_for_saving(self, state_dict):
        pass

    def hidden_pre(self, x):
        sae_in = x - self.b_dec * self.cfg.apply_b_dec_to_input
        return sae_in @ self.W_enc + self.b_enc

    def decode(self, acts):
        return acts @ self.W_dec + self.b_dec


class StandardSAE(_SAELensSAE):
    def encode(self, x):
        return torch.relu(self.hidden_pre(x))


class TopKSAE(_SAELensSAE):
    def encode(self, x):  # topk_sae.py TopK: topk of the pre-activations, ReLU of the kept values
        pre = self.hidden_pre(x)
        values, indices = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))


class JumpReLUSAE(_SAELensSAE):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.threshold = nn.Parameter(torch.zeros(cfg.d_sae))

    def encode(self, x):
        pre = self.hidden_pre(x)
        return torch.relu(pre) * (pre > self.threshold)


class BatchTopKTrainingSAE(TopKSAE):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("topk_threshold", torch.tensor(0.0))

    def process_state_dict_for_saving_inference(self, state_dict):
        threshold = state_dict.pop("topk_threshold").item()
        state_dict["threshold"] = torch.ones_like(self.b_enc) * threshold

    def encode_inference(self, x):  # what the saved inference SAE (jumprelu) computes
        pre = self.hidden_pre(x)
        return torch.relu(pre) * (pre > self.topk_threshold)


# ----------------------------------------------------------------------------- sparsify
@dataclass
class SparseCoderConfig:
    activation: str = "topk"
    expansion_factor: int = 32
    normalize_decoder: bool = True
    num_latents: int = 0
    k: int = 32
    multi_topk: bool = False
    skip_connection: bool = False
    transcode: bool = False

    def to_dict(self):
        return dataclasses.asdict(self)


class SparseCoder(nn.Module):
    def __init__(self, d_in: int, cfg: SparseCoderConfig):
        super().__init__()
        self.cfg = cfg
        self.d_in = d_in
        self.num_latents = cfg.num_latents or d_in * cfg.expansion_factor
        self.encoder = nn.Linear(d_in, self.num_latents)
        self.encoder.bias.data.zero_()
        self.W_dec = nn.Parameter(self.encoder.weight.data.clone())
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_in)) if cfg.skip_connection else None

    def reference_codes(self, x):  # encode: relu(encoder(x − b_dec)), top-k of the rectified values
        pre = torch.relu(self.encoder(x - self.b_dec))
        values, indices = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, indices, values)


# ----------------------------------------------------------------------------- dictionary_learning
class AutoEncoder(nn.Module):
    def __init__(self, activation_dim: int, dict_size: int):
        super().__init__()
        self.activation_dim, self.dict_size = activation_dim, dict_size
        self.bias = nn.Parameter(torch.zeros(activation_dim))
        self.encoder = nn.Linear(activation_dim, dict_size, bias=True)
        self.decoder = nn.Linear(dict_size, activation_dim, bias=False)

    def encode(self, x):
        return nn.ReLU()(self.encoder(x - self.bias))


class AutoEncoderTopK(nn.Module):
    def __init__(self, activation_dim: int, dict_size: int, k: int):
        super().__init__()
        self.activation_dim, self.dict_size = activation_dim, dict_size
        self.register_buffer("k", torch.tensor(k, dtype=torch.int))
        self.register_buffer("threshold", torch.tensor(-1.0, dtype=torch.float32))
        self.decoder = nn.Linear(dict_size, activation_dim, bias=False)
        self.encoder = nn.Linear(activation_dim, dict_size)
        self.b_dec = nn.Parameter(torch.zeros(activation_dim))

    def encode(self, x):
        post_relu = nn.functional.relu(self.encoder(x - self.b_dec))
        values, indices = post_relu.topk(int(self.k), sorted=False, dim=-1)
        return torch.zeros_like(post_relu).scatter_(-1, indices, values)


def randomize(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module
