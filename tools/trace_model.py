#!/usr/bin/env python3
"""Record the GPU allocation trace of a model's training step, without a GPU.

Usage:
    tools/trace_model.py --model gpt2 --batch-size 4 --seq-len 512 --output gpt2.trace
    tools/trace_model.py --model llama --batch-size 1 --seq-len 1024 --checkpointing
    tools/trace_model.py --model resnet50 --batch-size 32 --grad-accum-steps 2
    tools/trace_model.py --model llama-tiny --layers 2 --dtype bfloat16 --steps 3
    tools/trace_model.py --module mypkg.models:make_model --output mine.trace

Your own model (--module MODULE:FUNCTION, MODULE imported as Python imports it, the current
folder first): FUNCTION() is called with PyTorch's meta device as the default device and returns
(model, make_batch): `model` an nn.Module, `make_batch(device)` a tuple of the arguments of one
micro-batch's forward call, `model(*make_batch(device))`, which returns the loss (a tensor that is
not a scalar is summed). Parameters are cast to --dtype; --batch-size, --seq-len, --image-size,
--layers, --checkpointing, --attention and --dropout are the built-in models' and do not apply.

Models (built here in plain torch from their published configurations):
    gpt2          GPT-2 small (124M): 12 layers, 12 heads, 768 wide, vocab 50257, context 1024
    gpt2-medium   GPT-2 medium (355M): 24 layers, 16 heads, 1024 wide
    llama         Llama 3.2 1B: hidden 2048, 16 layers, 32 heads, 8 kv heads, MLP 8192,
                  vocab 128256, tied embeddings (RMSNorm, rotary, SwiGLU, grouped-query attention)
    llama-tiny    the same architecture, small: hidden 512, 4 layers, 8 heads, 2 kv heads,
                  MLP 1536, vocab 32000, tied embeddings
    resnet50      torchvision.models.resnet50(weights=None), 1000 classes

What runs: the model is built on PyTorch's `meta` device (tensors with shapes, dtypes and
storages but no data), so nothing is computed and a step takes seconds on a CPU. The model's
parameters and buffers are "loaded" first (one `alloc` each, in the order `model.to("cuda")`
would allocate them). Then --steps optimizer steps run, each one: --grad-accum-steps
micro-batches of --batch-size samples (a fresh input batch, forward, loss divided by the number
of micro-batches when it is above 1, backward), then AdamW's step (multi-tensor "foreach"
implementation, PyTorch's default on CUDA) and zero_grad(set_to_none=True).

How allocations are seen: a TorchDispatchMode sees every aten operator call under autograd
(forward, backward, optimizer). Each meta tensor an operator returns whose storage is new gives
one `alloc` of the storage's nbytes (views share their base's storage and are not counted
again; zero-byte storages are not allocations). The recorder holds a weak reference to each live
storage (StorageWeakRef: it does not keep the storage alive) and, before every operator call and
at every phase marker, emits `free_requested` + `free_completed` for each storage whose last
reference went away. A storage dies when its last tensor, view, autograd-saved copy or Python
reference does, just as a CUDA block goes back to PyTorch's caching allocator. Addresses are
fake, 512-byte aligned and never reused. All events use stream 0 and carry no time.

Phase markers are comment lines (`# step 1 micro 1 forward`, `# step 1 micro 1 backward`,
`# step 1 optimizer`, `# step 1 zero_grad`, `# end`). The trace ends with the parameters and
the optimizer state still live.

Precision: --dtype float32 trains in float32. --dtype bfloat16 casts the whole model (parameters,
buffers, so also gradients and AdamW state) to bfloat16 ("pure bf16", no float32 master
weights); the logits are upcast to float32 for the loss, as Hugging Face's causal-LM loss does.

Not recorded: workspaces that kernels take inside one operator call (cuBLAS, cuDNN,
flash-attention backward accumulators) and the CUDA context, which a CUDA run does allocate;
and tensors that a CUDA run keeps on the host (the fused attention kernels' RNG seed and offset,
AdamW's step counters), which are left out here too.

Attention uses the kernel that SDPA would pick on a recent GPU, called directly (--attention
auto: flash for bfloat16, memory-efficient for float32); `math` is the unfused reference that
materializes the attention matrix. Llama repeats its key/value heads for grouped-query
attention before the kernel, as Hugging Face's implementation does.

--seed seeds torch's RNG; meta tensors carry no data, so it does not change the trace.
"""

import argparse
import gc
import os
import sys
import time

ALIGN = 512
BASE_ADDRESS = 0x7F0000000000

TRANSFORMERS = ("gpt2", "gpt2-medium", "llama", "llama-tiny")
MODELS = TRANSFORMERS + ("resnet50",)

GPT2_CONFIGS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_ctx=1024),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, n_ctx=1024),
}

LLAMA_CONFIGS = {
    "llama": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    "llama-tiny": dict(
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1536,
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
}

DEFAULT_BATCH = {"resnet50": 32}
DEFAULT_TRANSFORMER_BATCH = 4
DEFAULT_SEQ_LEN = 512
DEFAULT_IMAGE_SIZE = 224


class UsageError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="trace_model.py",
        description="Record the GPU allocation trace (gpumem trace format 1) of a model's "
        "training steps on PyTorch's meta device, without a GPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the docstring at the top of tools/trace_model.py for what is recorded.",
    )
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--module", metavar="MODULE:FUNCTION",
                   help="your own model: FUNCTION in MODULE returns (model, make_batch); see the "
                   "docstring")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per micro-batch (default 4; resnet50: 32)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sample, transformers only (default 512)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image height and width, resnet50 only (default 224)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the number of transformer blocks (smaller traces)")
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing per transformer block / per resnet stage "
                   "(torch.utils.checkpoint, use_reentrant=False)")
    p.add_argument("--grad-accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step (default 1)")
    p.add_argument("--steps", type=int, default=2,
                   help="optimizer steps (default 2: the second one is a steady-state step)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--attention", choices=("auto", "flash", "efficient", "math"), default="auto",
                   help="attention kernel (auto: flash for bfloat16, efficient for float32)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="GPT-2 dropout probability (published config: 0.1; default 0)")
    p.add_argument("--output", default="-", help="trace file (default: standard output)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        check_args(args)
    except UsageError as e:
        p.error(str(e))
    return args


def check_module_args(args):
    """--module: what the built-in models' flags would mean does not apply."""
    if args.model is not None:
        raise UsageError("give --model or --module, not both")
    module, sep, function = args.module.partition(":")
    if not sep or not module or not function or not function.isidentifier():
        raise UsageError(f"--module needs MODULE:FUNCTION (e.g. mypkg.models:make_model), "
                         f"got {args.module!r}")
    for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len),
                        ("--image-size", args.image_size), ("--layers", args.layers)):
        if value is not None:
            raise UsageError(f"{flag} applies to the built-in models only (--model)")
    if args.checkpointing:
        raise UsageError("--checkpointing applies to the built-in models only (--model)")
    if args.dropout != 0.0 or args.attention != "auto":
        raise UsageError("--dropout and --attention apply to the built-in models only (--model)")
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.grad_accum_steps < 1:
        raise UsageError("--grad-accum-steps must be at least 1")
    if args.output != "-":
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise UsageError(f"--output: folder {folder} does not exist")
    args.attention_kernel = None


def check_args(args):
    if args.module is not None:
        return check_module_args(args)
    if args.model is None:
        raise UsageError("give --model or --module")
    transformer = args.model in TRANSFORMERS
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH.get(args.model, DEFAULT_TRANSFORMER_BATCH)
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.grad_accum_steps < 1:
        raise UsageError("--grad-accum-steps must be at least 1")
    if not 0.0 <= args.dropout < 1.0:
        raise UsageError("--dropout must be in [0, 1)")
    if transformer:
        if args.image_size is not None:
            raise UsageError("--image-size applies to resnet50 only")
        if args.seq_len is None:
            args.seq_len = DEFAULT_SEQ_LEN
        if args.seq_len < 1:
            raise UsageError("--seq-len must be at least 1")
        if args.model in GPT2_CONFIGS:
            n_ctx = GPT2_CONFIGS[args.model]["n_ctx"]
            if args.seq_len > n_ctx:
                raise UsageError(f"--seq-len {args.seq_len} exceeds {args.model}'s context "
                                 f"of {n_ctx} tokens")
        else:
            limit = LLAMA_CONFIGS[args.model]["max_position_embeddings"]
            if args.seq_len > limit:
                raise UsageError(f"--seq-len {args.seq_len} exceeds {args.model}'s "
                                 f"{limit} positions")
        if args.layers is not None and args.layers < 1:
            raise UsageError("--layers must be at least 1")
    else:
        if args.seq_len is not None:
            raise UsageError("--seq-len applies to transformer models only")
        if args.layers is not None:
            raise UsageError("--layers applies to transformer models only")
        if args.image_size is None:
            args.image_size = DEFAULT_IMAGE_SIZE
        if args.image_size < 32:
            raise UsageError("--image-size must be at least 32")
    if args.model not in GPT2_CONFIGS and args.dropout != 0.0:
        raise UsageError("--dropout applies to gpt2 and gpt2-medium only")
    if args.output != "-":
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise UsageError(f"--output: folder {folder} does not exist")
    if args.attention == "auto":
        args.attention_kernel = "flash" if args.dtype == "bfloat16" else "efficient"
    else:
        args.attention_kernel = args.attention
    if args.attention_kernel == "flash" and args.dtype != "bfloat16":
        raise UsageError("--attention flash needs --dtype bfloat16 (flash attention has no "
                         "float32 kernel)")


def source_line(args):
    if args.module is not None:
        return (f"trace_model.py module {args.module} accum={args.grad_accum_steps} "
                f"dtype={args.dtype} steps={args.steps}")
    if args.model in TRANSFORMERS:
        shape = f"batch={args.batch_size} seq={args.seq_len}"
    else:
        shape = f"batch={args.batch_size} image={args.image_size}"
    text = (f"trace_model.py {args.model} {shape} ckpt={int(args.checkpointing)} "
            f"accum={args.grad_accum_steps} dtype={args.dtype} steps={args.steps}")
    if args.layers is not None:
        text += f" layers={args.layers}"
    if args.model in TRANSFORMERS:
        text += f" attention={args.attention_kernel}"
    if args.dropout:
        text += f" dropout={args.dropout:g}"
    return text


def import_torch(model):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.stderr.write(
            "trace_model.py: cannot import torch (%s).\n"
            "Install PyTorch (CPU is enough), e.g.: pip install torch torchvision\n" % e)
        raise SystemExit(3)
    if model == "resnet50":  # (None: --module)
        try:
            import torchvision  # noqa: F401
        except ImportError as e:
            sys.stderr.write(
                "trace_model.py: cannot import torchvision (%s), needed for resnet50.\n"
                "Install it, e.g.: pip install torchvision\n" % e)
            raise SystemExit(3)


# ---------------------------------------------------------------------------------------------
# Everything below needs torch; main() imports it first.


def build_recorder_class():
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    # Outputs that CUDA kernels create on the host (RNG seed and offset of the fused attention
    # kernels without dropout), by position in the operator's output tuple.
    host_outputs = {}
    for name, positions in (("_scaled_dot_product_flash_attention", (6, 7)),
                            ("_scaled_dot_product_efficient_attention", (2, 3))):
        packet = getattr(aten, name, None)
        if packet is not None:
            for overload in packet.overloads():
                host_outputs[getattr(packet, overload)] = positions

    class StorageRecorder(TorchDispatchMode):
        """Turns the births and deaths of `device_type` storages into trace events.

        Storages are identified by their StorageImpl (`_cdata`); the recorder keeps a weak
        reference to each, which also keeps the StorageImpl's address from being reused while
        the recorder tracks it.
        """

        def __init__(self, device_type="meta"):
            super().__init__()
            self.device_type = device_type
            self.lines = []
            self.live = {}      # storage key -> [StorageWeakRef, address or None, nbytes]
            self.ignored = {}   # storage key -> StorageWeakRef (host-side outputs)
            self.next_address = BASE_ADDRESS
            self.events = 0
            self.allocations = 0
            self.live_bytes = 0
            self.peak_live_bytes = 0
            self.untracked_inputs = 0
            self.resized = 0

        # -- events ---------------------------------------------------------------------------

        def _alloc(self, key, storage, nbytes):
            address = None
            if nbytes > 0:
                address = self.next_address
                self.next_address += -(-nbytes // ALIGN) * ALIGN
                self.lines.append("alloc 0x%x %d 0" % (address, nbytes))
                self.events += 1
                self.allocations += 1
                self.live_bytes += nbytes
                if self.live_bytes > self.peak_live_bytes:
                    self.peak_live_bytes = self.live_bytes
            self.live[key] = [StorageWeakRef(storage), address, nbytes]

        def _free(self, entry):
            _, address, nbytes = entry
            if address is not None:
                self.lines.append("free_requested 0x%x %d 0" % (address, nbytes))
                self.lines.append("free_completed 0x%x %d 0" % (address, nbytes))
                self.events += 2
                self.live_bytes -= nbytes

        def poll(self):
            """Emits the frees of every tracked storage that died since the last poll."""
            dead = [key for key, entry in self.live.items() if entry[0].expired()]
            for key in dead:
                self._free(self.live.pop(key))
            gone = [key for key, ref in self.ignored.items() if ref.expired()]
            for key in gone:
                del self.ignored[key]

        def mark(self, text):
            self.poll()
            self.lines.append("# " + text)

        def track(self, tensor):
            """Records `tensor`'s storage if it is new; returns True if it was."""
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
                return False
            storage = tensor.untyped_storage()
            key = storage._cdata
            entry = self.live.get(key)
            if entry is not None:
                nbytes = storage.nbytes()
                if nbytes != entry[2]:
                    # The storage was resized in place: the allocator would hand out a new
                    # block and release the old one.
                    self.resized += 1
                    old = self.live.pop(key)
                    self._alloc(key, storage, nbytes)
                    self._free(old)
                return False
            if key in self.ignored:
                return False
            self._alloc(key, storage, storage.nbytes())
            return True

        def ignore(self, tensor):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == self.device_type:
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key not in self.live and key not in self.ignored:
                    self.ignored[key] = StorageWeakRef(storage)

        # -- dispatch -------------------------------------------------------------------------

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.poll()
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and self.track(t):
                    # An input storage that no recorded operator produced (should not happen;
                    # counted and reported so that it cannot go unnoticed).
                    self.untracked_inputs += 1
            out = func(*args, **kwargs)
            positions = host_outputs.get(func)
            if positions is not None and isinstance(out, (tuple, list)):
                for i, t in enumerate(out):
                    if i in positions:
                        self.ignore(t)
            for t in tree_leaves(out):
                self.track(t)
            return out

    return StorageRecorder


# ---------------------------------------------------------------------------------------------
# Models


def build_models_module():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    aten = torch.ops.aten

    def attention(q, k, v, kernel, dropout_p):
        """Causal attention over (batch, heads, tokens, head_dim) tensors."""
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True)[0]
        if kernel == "efficient":
            needs_grad = torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad)
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, None, needs_grad, dropout_p, True)[0]
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)

    def run_blocks(blocks, x, extra, use_checkpoint):
        for block in blocks:
            if use_checkpoint and torch.is_grad_enabled():
                x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                x = block(x, *extra)
        return x

    # -- GPT-2 ----------------------------------------------------------------------------------

    class GPT2Attention(nn.Module):
        def __init__(self, cfg, kernel, dropout):
            super().__init__()
            self.n_head = cfg["n_head"]
            self.n_embd = cfg["n_embd"]
            self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd)
            self.c_proj = nn.Linear(self.n_embd, self.n_embd)
            self.kernel = kernel
            self.dropout = dropout

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            hd = C // self.n_head
            q = q.view(B, T, self.n_head, hd).transpose(1, 2)
            k = k.view(B, T, self.n_head, hd).transpose(1, 2)
            v = v.view(B, T, self.n_head, hd).transpose(1, 2)
            p = self.dropout if self.training else 0.0
            y = attention(q, k, v, self.kernel, p)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return F.dropout(self.c_proj(y), p, self.training)

    class GPT2MLP(nn.Module):
        def __init__(self, cfg, dropout):
            super().__init__()
            self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"])
            self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"])
            self.dropout = dropout

        def forward(self, x):
            h = F.gelu(self.c_fc(x), approximate="tanh")
            return F.dropout(self.c_proj(h), self.dropout, self.training)

    class GPT2Block(nn.Module):
        def __init__(self, cfg, kernel, dropout):
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=1e-5)
            self.attn = GPT2Attention(cfg, kernel, dropout)
            self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=1e-5)
            self.mlp = GPT2MLP(cfg, dropout)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):
        def __init__(self, cfg, kernel, dropout, use_checkpoint):
            super().__init__()
            self.cfg = cfg
            self.wte = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
            self.wpe = nn.Embedding(cfg["n_ctx"], cfg["n_embd"])
            self.h = nn.ModuleList(GPT2Block(cfg, kernel, dropout)
                                   for _ in range(cfg["n_layer"]))
            self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=1e-5)
            self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)
            self.lm_head.weight = self.wte.weight
            self.dropout = dropout
            self.use_checkpoint = use_checkpoint

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, dtype=torch.long, device=idx.device)
            x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
            x = run_blocks(self.h, x, (), self.use_checkpoint)
            logits = self.lm_head(self.ln_f(x)).float()
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    # -- Llama ----------------------------------------------------------------------------------

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            dtype = x.dtype
            h = x.to(torch.float32)
            variance = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(variance + self.eps)
            return self.weight * h.to(dtype)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class LlamaAttention(nn.Module):
        def __init__(self, cfg, kernel):
            super().__init__()
            h = cfg["hidden_size"]
            self.n_head = cfg["num_attention_heads"]
            self.n_kv = cfg["num_key_value_heads"]
            self.hd = h // self.n_head
            self.q_proj = nn.Linear(h, self.n_head * self.hd, bias=False)
            self.k_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
            self.v_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
            self.o_proj = nn.Linear(self.n_head * self.hd, h, bias=False)
            self.kernel = kernel

        def repeat_kv(self, x):
            n_rep = self.n_head // self.n_kv
            if n_rep == 1:
                return x
            B, H, T, D = x.shape
            return x[:, :, None, :, :].expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            y = attention(q, self.repeat_kv(k), self.repeat_kv(v), self.kernel, 0.0)
            y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hd)
            return self.o_proj(y)

    class LlamaMLP(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            h, i = cfg["hidden_size"], cfg["intermediate_size"]
            self.gate_proj = nn.Linear(h, i, bias=False)
            self.up_proj = nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class LlamaBlock(nn.Module):
        def __init__(self, cfg, kernel):
            super().__init__()
            self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
            self.self_attn = LlamaAttention(cfg, kernel)
            self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
            self.mlp = LlamaMLP(cfg)

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self, cfg, kernel, use_checkpoint):
            super().__init__()
            self.cfg = cfg
            h = cfg["hidden_size"]
            hd = h // cfg["num_attention_heads"]
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
            self.layers = nn.ModuleList(LlamaBlock(cfg, kernel)
                                        for _ in range(cfg["num_hidden_layers"]))
            self.norm = RMSNorm(h, cfg["rms_norm_eps"])
            inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32)
                                                    / hd))
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self.lm_head = nn.Linear(h, cfg["vocab_size"], bias=False)
            if cfg["tie_word_embeddings"]:
                self.lm_head.weight = self.embed_tokens.weight
            self.use_checkpoint = use_checkpoint

        def rotary(self, T, device, dtype):
            pos = torch.arange(T, device=device, dtype=torch.float32)
            freqs = torch.outer(pos, self.inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(dtype), emb.sin().to(dtype)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.embed_tokens(idx)
            cos, sin = self.rotary(T, x.device, x.dtype)
            x = run_blocks(self.layers, x, (cos, sin), self.use_checkpoint)
            logits = self.lm_head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    # -- ResNet ---------------------------------------------------------------------------------

    class CheckpointedStage(nn.Module):
        def __init__(self, stage):
            super().__init__()
            self.stage = stage

        def forward(self, x):
            if torch.is_grad_enabled():
                return checkpoint(self.stage, x, use_reentrant=False)
            return self.stage(x)

    class ImageClassifier(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, images, labels):
            return F.cross_entropy(self.net(images).float(), labels)

    def build(args):
        if args.model in GPT2_CONFIGS:
            cfg = dict(GPT2_CONFIGS[args.model])
            if args.layers is not None:
                cfg["n_layer"] = args.layers
            return GPT2(cfg, args.attention_kernel, args.dropout, args.checkpointing)
        if args.model in LLAMA_CONFIGS:
            cfg = dict(LLAMA_CONFIGS[args.model])
            if args.layers is not None:
                cfg["num_hidden_layers"] = args.layers
            return Llama(cfg, args.attention_kernel, args.checkpointing)
        import torchvision
        net = torchvision.models.resnet50(weights=None)
        if args.checkpointing:
            for name in ("layer1", "layer2", "layer3", "layer4"):
                setattr(net, name, CheckpointedStage(getattr(net, name)))
        return ImageClassifier(net)

    return build


def load_order(module):
    """Parameters and buffers in the order Module._apply (model.to("cuda")) visits them."""
    out = []
    for child in module.children():
        out.extend(load_order(child))
    out.extend(p for p in module._parameters.values() if p is not None)
    out.extend(b for b in module._buffers.values() if b is not None)
    return out


def make_batch(args, device):
    import torch
    if args.model in TRANSFORMERS:
        shape = (args.batch_size, args.seq_len)
        return (torch.empty(shape, dtype=torch.long, device=device),
                torch.empty(shape, dtype=torch.long, device=device))
    dtype = getattr(torch, args.dtype)
    images = torch.empty((args.batch_size, 3, args.image_size, args.image_size),
                         dtype=dtype, device=device)
    return images, torch.empty((args.batch_size,), dtype=torch.long, device=device)


def user_factory(spec):
    """The function MODULE:FUNCTION names (--module), imported with the current folder first."""
    import importlib
    module_name, _, function = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"--module: cannot import {module_name}: {e}")
    factory = getattr(module, function, None)
    if not callable(factory):
        raise UsageError(f"--module: {module_name} has no function {function}")
    return factory


def record(args):
    """Runs the training steps and returns (recorder, parameter_bytes, loaded_bytes)."""
    import torch

    torch.manual_seed(args.seed)
    device = torch.device("meta")
    Recorder = build_recorder_class()
    user_batch = None
    if args.module is not None:
        factory = user_factory(args.module)
        with device:
            made = factory()
        if (not isinstance(made, tuple) or len(made) != 2 or not isinstance(made[0], torch.nn.Module)
                or not callable(made[1])):
            raise UsageError(f"--module: {args.module}() must return (model, make_batch), an "
                             f"nn.Module and a function of the device")
        model, user_batch = made
    else:
        build = build_models_module()
        with device:
            model = build(args)
    model.to(getattr(torch, args.dtype))
    model.train()

    recorder = Recorder(device_type=device.type)
    loaded = load_order(model)
    for t in loaded:
        recorder.track(t)
    loaded_bytes = recorder.live_bytes
    param_storages = {}
    for p in model.parameters():
        param_storages[p.untyped_storage()._cdata] = p.untyped_storage().nbytes()
    parameter_bytes = sum(param_storages.values())
    recorder.lines.append("# model loaded: %d parameter tensors, %d parameter bytes, "
                          "%d bytes with buffers"
                          % (len(param_storages), parameter_bytes, loaded_bytes))

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
    accum = args.grad_accum_steps

    def micro_step(step, micro):
        recorder.mark("step %d micro %d forward" % (step, micro))
        if user_batch is not None:
            batch = user_batch(device)
            loss = model(*(batch if isinstance(batch, tuple) else (batch,)))
            if loss.dim() != 0:
                loss = loss.sum()
        else:
            inputs, targets = make_batch(args, device)
            loss = model(inputs, targets)
        if accum > 1:
            loss = loss / accum
        recorder.mark("step %d micro %d backward" % (step, micro))
        loss.backward()

    with recorder:
        for step in range(1, args.steps + 1):
            for micro in range(1, accum + 1):
                micro_step(step, micro)
            recorder.mark("step %d optimizer" % step)
            optimizer.step()
            recorder.mark("step %d zero_grad" % step)
            optimizer.zero_grad(set_to_none=True)
        gc.collect()
        recorder.mark("end")
    return recorder, parameter_bytes, loaded_bytes


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return str(n)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import_torch(args.model)
    started = time.monotonic()
    try:
        recorder, parameter_bytes, loaded_bytes = record(args)
    except UsageError as e:
        sys.stderr.write("trace_model.py: %s\n" % e)
        return 2
    elapsed = time.monotonic() - started

    import torch
    text = "gpumem-trace 1\n@source %s\n# recorded with torch %s on the meta device\n%s\n" % (
        source_line(args), torch.__version__, "\n".join(recorder.lines))
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            sys.stderr.write("trace_model.py: cannot write %s: %s\n" % (args.output, e))
            return 1
    note = ""
    if recorder.untracked_inputs:
        note += ", %d untracked input storages" % recorder.untracked_inputs
    if recorder.resized:
        note += ", %d resized storages" % recorder.resized
    sys.stderr.write(
        "trace_model.py: %s: %d events, %d allocations, peak live bytes %d (%s), "
        "parameters %d bytes, end live bytes %d, %.1f s%s\n"
        % (source_line(args).split(" ", 1)[1], recorder.events, recorder.allocations,
           recorder.peak_live_bytes, human(recorder.peak_live_bytes), parameter_bytes,
           recorder.live_bytes, elapsed, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
