"""Frontier models' weights as resharding trees: the shapes of published configs, the
training layouts they sync from and the inference layouts they sync to.

Shapes come from each model's published ``config.json`` on the Hugging Face Hub:

* DeepSeek-V3 (https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json):
  ``hidden_size`` 7168, ``num_hidden_layers`` 61, ``first_k_dense_replace`` 3,
  ``intermediate_size`` 18432, ``moe_intermediate_size`` 2048, ``n_routed_experts`` 256,
  ``n_shared_experts`` 1, ``num_attention_heads`` 128, ``q_lora_rank`` 1536,
  ``kv_lora_rank`` 512, ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64,
  ``v_head_dim`` 128, ``vocab_size`` 129280 (its multi-token-prediction layer,
  ``num_nextn_predict_layers`` 1, is left out: inference engines load it only for
  speculative decoding);
* Kimi-K2 (https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json):
  the DeepSeek-V3 architecture with ``n_routed_experts`` 384, ``first_k_dense_replace`` 1,
  ``num_attention_heads`` 64, ``vocab_size`` 163840 (other dims as DeepSeek-V3's);
* Qwen3-235B-A22B (https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json):
  ``hidden_size`` 4096, ``num_hidden_layers`` 94 (every one MoE), ``num_attention_heads``
  64, ``num_key_value_heads`` 4, ``head_dim`` 128, ``num_experts`` 128,
  ``moe_intermediate_size`` 1536, ``vocab_size`` 151936, untied embeddings.

Experts are stacked: one ``[E, d, f]`` (gate, up) or ``[E, f, d]`` (down) leaf per layer
and matrix, as training frameworks hold them (grouped GEMM), so a model is about a
thousand leaves. Matrices are ``[in, out]``. Weights are bfloat16; an ``fp8`` wire sends
the matrices the published FP8 checkpoints store in e4m3 (attention projections, dense,
shared and routed experts' MLPs; not embeddings, LM head, norms or the router) as 1-byte
elements: the planner's dtypes have no fp8 name, and planning only reads element sizes,
so they are planned as ``uint8`` (the per-block scales, 1/16384 of the bytes, are left out).

Layouts (meshes are host-major; the trainer on hosts ``0..T-1``, the replicas after it):

* ``fsdp``: every leaf sharded over all ``T x D`` training devices along its first
  dimension that divides evenly (``S01``), else over hosts and devices along two
  dimensions, else over hosts only, else replicated (small vectors);
* ``ep_fsdp``: routed experts split over hosts (dim 0) and sharded over each host's
  devices along their first other dimension that divides (expert parallel x FSDP); the
  rest as ``fsdp``;
* inference: ``R`` replicas of ``H`` hosts x ``D`` devices (a ``R x H x D`` mesh):
  tensor parallel inside a host (column-parallel q_b/kv_b/q/k/v/gate/up, row-parallel
  o/down, vocabulary-parallel embedding and LM head, replicated norms, router and MLA's
  down-projections), routed experts split over the replica's hosts (expert parallel) and
  tensor parallel over ``f`` inside each; every replica holds the whole model. Qwen3's 4
  KV heads over 8 devices are split by column (half a head each) where vLLM would
  replicate each head on two devices: the same bytes per device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from alpa_comm import ClusterSpec, Resharding

BF16, FP8_WIRE = "bfloat16", "uint8"
"""The dtype names the planner is given: bfloat16 weights, and fp8 (e4m3) as 1-byte elements."""


@dataclass(frozen=True)
class ModelShape:
    """The config fields the weights' shapes are made of (``config.json`` names)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    moe_intermediate_size: int
    n_routed_experts: int
    intermediate_size: int = 0
    first_k_dense_replace: int = 0
    n_shared_experts: int = 0
    q_lora_rank: int = 0          # MLA (DeepSeek-V3, Kimi-K2); 0: grouped-query attention
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_key_value_heads: int = 0  # grouped-query attention (Qwen3)
    head_dim: int = 0


DEEPSEEK_V3 = ModelShape("DeepSeek-V3", hidden_size=7168, num_hidden_layers=61, vocab_size=129280,
                         num_attention_heads=128, moe_intermediate_size=2048, n_routed_experts=256,
                         intermediate_size=18432, first_k_dense_replace=3, n_shared_experts=1, q_lora_rank=1536,
                         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
KIMI_K2 = replace(DEEPSEEK_V3, name="Kimi-K2", n_routed_experts=384, first_k_dense_replace=1, num_attention_heads=64,
                  vocab_size=163840)
QWEN3_235B = ModelShape("Qwen3-235B-A22B", hidden_size=4096, num_hidden_layers=94, vocab_size=151936,
                        num_attention_heads=64, moe_intermediate_size=1536, n_routed_experts=128,
                        num_key_value_heads=4, head_dim=128)
MODELS = {"deepseek-v3": DEEPSEEK_V3, "kimi-k2": KIMI_K2, "qwen3-235b": QWEN3_235B}
TINY = replace(DEEPSEEK_V3, name="tiny-mla", hidden_size=64, num_hidden_layers=3, vocab_size=256,
               num_attention_heads=4, moe_intermediate_size=32, n_routed_experts=8, intermediate_size=128,
               first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
               v_head_dim=8)
"""A DeepSeek-V3-shaped model small enough for a test: 1 dense and 2 MoE layers of width 64."""


@dataclass(frozen=True)
class Param:
    """One leaf: its name, shape, tensor-parallel role and whether an fp8 wire carries it.

    Roles: ``rep`` (whole on every device), ``col`` / ``row`` (``[in, out]`` split by out /
    in), ``vocab_row`` / ``vocab_col`` (embedding / LM head), ``expert_col`` ([E, d, f],
    split by f) and ``expert_row`` ([E, f, d], split by f)."""

    name: str
    shape: tuple
    role: str
    fp8: bool = False

    @property
    def expert(self) -> bool:
        return self.role.startswith("expert")


def model_params(m: ModelShape) -> list[Param]:
    """Every leaf of ``m``, in checkpoint order."""
    d = m.hidden_size
    out = [Param("embed_tokens", (m.vocab_size, d), "vocab_row")]
    for i in range(m.num_hidden_layers):
        p = f"layers.{i:02d}."
        out.append(Param(p + "input_layernorm", (d,), "rep"))
        out += _attention(m, p)
        out.append(Param(p + "post_attention_layernorm", (d,), "rep"))
        if i < m.first_k_dense_replace:
            out += _mlp(p + "mlp.", d, m.intermediate_size)
            continue
        e, f = m.n_routed_experts, m.moe_intermediate_size
        out.append(Param(p + "mlp.gate", (d, e), "rep"))
        if m.q_lora_rank:  # DeepSeek's aux-loss-free routing bias
            out.append(Param(p + "mlp.gate.e_score_correction_bias", (e,), "rep"))
        out += [Param(p + "mlp.experts.gate_proj", (e, d, f), "expert_col", True),
                Param(p + "mlp.experts.up_proj", (e, d, f), "expert_col", True),
                Param(p + "mlp.experts.down_proj", (e, f, d), "expert_row", True)]
        if m.n_shared_experts:
            out += _mlp(p + "mlp.shared_experts.", d, f * m.n_shared_experts)
    return out + [Param("norm", (d,), "rep"), Param("lm_head", (d, m.vocab_size), "vocab_col")]


def _attention(m: ModelShape, p: str) -> list[Param]:
    d, h, a = m.hidden_size, m.num_attention_heads, p + "self_attn."
    if m.q_lora_rank:  # multi-head latent attention
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        return [Param(a + "q_a_proj", (d, m.q_lora_rank), "rep", True),
                Param(a + "q_a_layernorm", (m.q_lora_rank,), "rep"),
                Param(a + "q_b_proj", (m.q_lora_rank, h * qk), "col", True),
                Param(a + "kv_a_proj_with_mqa", (d, m.kv_lora_rank + m.qk_rope_head_dim), "rep", True),
                Param(a + "kv_a_layernorm", (m.kv_lora_rank,), "rep"),
                Param(a + "kv_b_proj", (m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim)), "col", True),
                Param(a + "o_proj", (h * m.v_head_dim, d), "row", True)]
    hd, kv = m.head_dim, m.num_key_value_heads
    return [Param(a + "q_proj", (d, h * hd), "col", True), Param(a + "k_proj", (d, kv * hd), "col", True),
            Param(a + "v_proj", (d, kv * hd), "col", True), Param(a + "o_proj", (h * hd, d), "row", True),
            Param(a + "q_norm", (hd,), "rep"), Param(a + "k_norm", (hd,), "rep")]


def _mlp(p: str, d: int, f: int) -> list[Param]:
    return [Param(p + "gate_proj", (d, f), "col", True), Param(p + "up_proj", (d, f), "col", True),
            Param(p + "down_proj", (f, d), "row", True)]


def param_count(m: ModelShape) -> int:
    return sum(math.prod(p.shape) for p in model_params(m))


# ------------------------------------------------------------------ layouts
TRAIN_LAYOUTS = ("fsdp", "ep_fsdp")
WIRES = ("bf16", "fp8")


def fsdp_spec(shape: tuple, hosts: int, devices: int) -> str:
    """``shape`` sharded over a ``hosts x devices`` mesh as FSDP does (module docstring)."""
    n = hosts * devices
    for i, s in enumerate(shape):
        if s % n == 0:
            return _spec(len(shape), {i: "S01"})
    for i, s in enumerate(shape):
        if s % hosts == 0:
            for j, t in enumerate(shape):
                if j != i and t % devices == 0:
                    return _spec(len(shape), {i: "S0", j: "S1"})
            return _spec(len(shape), {i: "S0"})
    return "R" * len(shape)


def ep_fsdp_spec(shape: tuple, hosts: int, devices: int) -> str:
    """A routed experts' leaf ``[E, ...]``: E over hosts, FSDP over each host's devices."""
    if shape[0] % hosts:
        return fsdp_spec(shape, hosts, devices)
    for j, t in enumerate(shape[1:], 1):
        if t % devices == 0:
            return _spec(len(shape), {0: "S0", j: "S1"})
    return _spec(len(shape), {0: "S0"})


def infer_spec(p: Param) -> str:
    """``p`` on an inference mesh ``[replica, host, device]`` (module docstring)."""
    return {"rep": "R" * len(p.shape), "col": "RS2", "row": "S2R", "vocab_row": "S2R", "vocab_col": "RS2",
            "expert_col": "S1RS2", "expert_row": "S1S2R"}[p.role]


def _spec(ndim: int, split: dict) -> str:
    return "".join(split.get(i, "R") for i in range(ndim))


def host_list(first: int, n: int) -> str:
    return f"{first}-{first + n - 1}" if n > 1 else str(first)


@dataclass(frozen=True)
class Scenario:
    """One weight sync: a model, its training layout on ``train_hosts`` hosts, and
    ``replicas`` inference replicas of ``replica_hosts`` hosts each, over a wire."""

    model: str
    train: str
    train_hosts: int
    replicas: int
    replica_hosts: int
    wire: str = "bf16"
    devices: int = 8

    @property
    def label(self) -> str:
        return (f"{self.model} {self.train} {self.train_hosts}x{self.devices} -> {self.replicas} x "
                f"{self.replica_hosts}x{self.devices} TP/EP, {self.wire}")

    @property
    def hosts(self) -> int:
        return self.train_hosts + self.replicas * self.replica_hosts

    def shape(self) -> ModelShape:
        return MODELS[self.model] if self.model in MODELS else TINY


def tree(s: Scenario, m: ModelShape | None = None) -> list[Resharding]:
    """The scenario's leaves as ``Resharding`` records (a list: ``model_params`` order)."""
    m = m or s.shape()
    t, d = s.train_hosts, s.devices
    src = f"{t}x{d}@{host_list(0, t)}"
    dst = f"{s.replicas}x{s.replica_hosts}x{d}@{host_list(t, s.replicas * s.replica_hosts)}"
    out = []
    for p in model_params(m):
        train = (ep_fsdp_spec if s.train == "ep_fsdp" and p.expert else fsdp_spec)(p.shape, t, d)
        dtype = FP8_WIRE if s.wire == "fp8" and p.fp8 else BF16
        out.append(Resharding.between(p.shape, dtype, src, train, dst, infer_spec(p)))
    return out


NIC_GBPS, NICS_PER_HOST, NVLINK_GBPS, LATENCY_S = 400.0, 8, 3600.0, 20e-6
"""The cluster of the simulated runs: 8 x 400 Gbit/s NICs per host (one per GPU, as on
H100/H200 nodes), NVLink inside a host (450 GB/s a direction, one GPU's NVLink 4), 20 us
a message."""


def frontier_cluster(s: Scenario) -> ClusterSpec:
    return ClusterSpec(num_hosts=s.hosts, devices_per_host=s.devices, nic_send_gbps=NIC_GBPS,
                       nics_per_host=NICS_PER_HOST, intra_host_gbps=NVLINK_GBPS, latency_s=LATENCY_S)


SCENARIOS = (
    Scenario("deepseek-v3", "fsdp", 32, 2, 8),
    Scenario("deepseek-v3", "ep_fsdp", 64, 4, 4, "fp8"),
    Scenario("kimi-k2", "fsdp", 48, 2, 8),
    Scenario("kimi-k2", "ep_fsdp", 128, 4, 8, "fp8"),
    Scenario("qwen3-235b", "fsdp", 32, 4, 2),
    Scenario("qwen3-235b", "ep_fsdp", 64, 4, 2, "fp8"),
)
"""The published runs: each model from each training layout, 32-128 training hosts."""


def scaled(m: ModelShape, factor: int, layers: int | None = None) -> ModelShape:
    """``m`` with every width divided by ``factor`` (heads and experts kept, head dims
    divided) and ``layers`` layers (the dense ones kept first): the same leaves and
    layouts at a size an emulated cluster moves in seconds."""
    div = lambda v: max(1, v // factor) if v else 0  # noqa: E731
    n = layers or m.num_hidden_layers
    return replace(m, name=f"{m.name}/{factor}", hidden_size=div(m.hidden_size), num_hidden_layers=n,
                   first_k_dense_replace=min(m.first_k_dense_replace, max(0, n - 1)),
                   vocab_size=div(m.vocab_size), intermediate_size=div(m.intermediate_size),
                   moe_intermediate_size=div(m.moe_intermediate_size), q_lora_rank=div(m.q_lora_rank),
                   kv_lora_rank=div(m.kv_lora_rank), qk_nope_head_dim=div(m.qk_nope_head_dim),
                   qk_rope_head_dim=div(m.qk_rope_head_dim), v_head_dim=div(m.v_head_dim),
                   head_dim=div(m.head_dim))
