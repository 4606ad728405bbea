// gpumem bench — synthetic fragmentation workloads.
//
// Each workload is a deterministic function of its seed that drives an abstract allocator through
// `workload_context`: allocate(bytes, stream), deallocate(buffer), and optionally record_stream.
// The context keeps its own account of *requested* bytes (the live sum of the sizes asked for and
// its peak), so the figures do not depend on the allocator under test, and every allocator sees
// exactly the same sequence of calls: a workload never looks at the pointers it gets back (beyond
// handing them back), so the sequence is the same whatever allocator runs it, and the same
// workloads can later be written out as traces by an `allocator_ops` that records instead of
// allocating.
//
// Sizes are those of real models (named in each workload's comment), chosen so that peaks are a
// few GiB to a few tens of GiB: they fit an 80 GiB device with room to spare under any sane
// allocator, and each workload runs in well under a second against a simulated device.
//
// Randomness comes from `bench::rng` (splitmix64 with a fixed reduction), never from <random>'s
// distributions, whose results differ between standard libraries.
//
// Header-only; needs only the C++17 standard library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpumem::bench {

inline constexpr std::size_t kib = std::size_t{1} << 10;
inline constexpr std::size_t mib = std::size_t{1} << 20;
inline constexpr std::size_t gib = std::size_t{1} << 30;

/// A workload's name for a stream; 0 is the default stream. The adaptor maps ids to its own
/// streams (creating them on first use).
using stream_id = std::uint32_t;

/// What a workload drives: anything allocator-like, type-erased.
///  * allocate(bytes, stream) returns a pointer usable on `stream`, or throws (std::bad_alloc for
///    out of memory); never called with 0 bytes.
///  * deallocate(ptr) frees a pointer returned by allocate.
///  * record_stream(ptr, stream) marks ptr as also used on `stream`; may be left empty, in which
///    case workload_context::record_stream does nothing.
///  * empty_cache() returns the allocator's cached memory (torch.cuda.empty_cache()); may be left
///    empty, in which case workload_context::empty_cache does nothing.
struct allocator_ops {
  std::function<void*(std::size_t bytes, stream_id stream)> allocate;
  std::function<void(void* ptr)> deallocate;
  std::function<void(void* ptr, stream_id stream)> record_stream;
  std::function<void()> empty_cache;
};

/// One live allocation as a workload holds it.
struct buffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  stream_id stream = 0;
  bool live() const noexcept { return bytes != 0; }
};

/// The workload's side of the allocator: forwards calls to `allocator_ops` and counts requested
/// bytes. Not thread-safe (workloads are single-threaded, like one training process per device).
class workload_context {
 public:
  explicit workload_context(allocator_ops ops) : ops_(std::move(ops)) {
    if (!ops_.allocate || !ops_.deallocate) {
      throw std::invalid_argument("workload_context: allocate and deallocate are required");
    }
  }

  /// Allocates `bytes` (> 0) on `stream`. If the allocator throws, nothing is counted, the
  /// exception propagates, and attempted_bytes()/num_allocs() tell which request failed.
  buffer allocate(std::size_t bytes, stream_id stream = 0) {
    if (bytes == 0) throw std::invalid_argument("workload_context: allocation of 0 bytes");
    attempted_bytes_ = bytes;
    void* p = ops_.allocate(bytes, stream);
    ++num_allocs_;
    live_ += bytes;
    if (live_ > peak_) peak_ = live_;
    return buffer{p, bytes, stream};
  }

  /// Frees `b` and marks it dead (a second free of the same buffer object is a logic_error).
  void deallocate(buffer& b) {
    if (!b.live()) throw std::logic_error("workload_context: free of a buffer that is not live");
    ops_.deallocate(b.ptr);
    ++num_frees_;
    live_ -= b.bytes;
    b = buffer{};
  }

  /// Frees every live buffer of `v`, last first (the reverse of allocation order), then clears it.
  void deallocate_all(std::vector<buffer>& v) {
    for (auto it = v.rbegin(); it != v.rend(); ++it) {
      if (it->live()) deallocate(*it);
    }
    v.clear();
  }

  /// record_stream(b, stream) when the allocator supports it; otherwise nothing.
  void record_stream(const buffer& b, stream_id stream) {
    if (ops_.record_stream) ops_.record_stream(b.ptr, stream);
  }

  /// empty_cache() when the allocator supports it; otherwise nothing.
  void empty_cache() {
    if (ops_.empty_cache) ops_.empty_cache();
  }

  std::size_t live_requested() const noexcept { return live_; }
  std::size_t peak_requested() const noexcept { return peak_; }
  std::size_t num_allocs() const noexcept { return num_allocs_; }
  std::size_t num_frees() const noexcept { return num_frees_; }
  /// The size of the last allocate call, successful or not.
  std::size_t attempted_bytes() const noexcept { return attempted_bytes_; }

 private:
  allocator_ops ops_;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
  std::size_t num_allocs_ = 0;
  std::size_t num_frees_ = 0;
  std::size_t attempted_bytes_ = 0;
};

/// splitmix64: tiny, fast, and the same numbers on every platform.
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (inclusive); lo <= hi. Modulo reduction: the bias is < 2^-40 for the
  /// ranges used here, and the result is fixed by the seed everywhere.
  std::size_t uniform(std::size_t lo, std::size_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::size_t>(next() % span);
  }

 private:
  std::uint64_t state_;
};

// =================================================================================================
// (a) llm_training_varlen
//
// Pattern: pre-training / fine-tuning a decoder-only transformer where each step's sequence length
// differs (variable-length batches without packing, curriculum or bucketed data loaders). This is
// the most common fragmentation complaint against PyTorch's allocator: activations are sized by
// seq_len x hidden, so every step asks for a new set of sizes, while long-lived tensors created in
// between (the lazily created optimizer state, gradients) pin the segments they land in.
//
// Model: GPT-style, 1.3B parameters (24 layers, hidden 2048, 16 heads, FFN 8192, vocabulary 50304,
// LM head tied to the embedding — GPT-3 XL / GPT-Neo 1.3B shapes). Megatron-style mixed
// precision: bf16 weights and fp32 master weights allocated up front, one tensor per parameter;
// Adam's exp_avg / exp_avg_sq (fp32) created lazily by the first optimizer step, as
// torch.optim.Adam does; bf16 gradients created during backward and freed by
// zero_grad(set_to_none=True) (PyTorch's default since 2.0). Micro-batch 2, seq_len drawn per step
// uniformly from 128..4096 in multiples of 8.
//
// Per layer, forward keeps for backward: LayerNorm outputs and statistics, QKV, the attention
// output and its log-sum-exp (flash attention: no s x s matrix), the residual stream, FC1 and GELU
// outputs (the Korthikanti et al. 2022 accounting, "Reducing Activation Recomputation in Large
// Transformer Models", without dropout masks); temporaries (projections before the residual add)
// are freed at once. The loss keeps bf16 logits and fp32 log-probabilities (s x vocab). Backward
// walks the layers in reverse, freeing each layer's saved tensors as it goes, with input
// gradients, weight gradients and a flash-attention fp32 dq workspace. The optimizer step upcasts
// each gradient to a fp32 temporary. Peak requested is 32 GiB (seed 1).
// =================================================================================================
inline void llm_training_varlen(workload_context& ctx, std::uint64_t seed) {
  constexpr std::size_t layers = 24, h = 2048, heads = 16, ffn = 4 * h, vocab = 50304;
  constexpr std::size_t micro_batch = 2, steps = 40, seq_min = 128, seq_max = 4096;
  constexpr std::size_t bf16 = 2, fp32 = 4;

  // Parameters in model order: embedding (tied LM head), per layer 12 tensors, final LayerNorm.
  std::vector<std::size_t> params{vocab * h};
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t n : {h, h, 3 * h * h, 3 * h, h * h, h, h, h, ffn * h, ffn, h * ffn, h}) {
      params.push_back(n);
    }
  }
  params.push_back(h);
  params.push_back(h);
  constexpr std::size_t per_layer = 12;
  auto layer_param = [&](std::size_t layer, std::size_t k) { return 1 + layer * per_layer + k; };
  const std::size_t final_ln = 1 + layers * per_layer;

  std::vector<buffer> weights, master, exp_avg, exp_avg_sq;
  for (std::size_t n : params) weights.push_back(ctx.allocate(n * bf16));
  for (std::size_t n : params) master.push_back(ctx.allocate(n * fp32));
  std::vector<buffer> grads(params.size());
  auto grad = [&](std::size_t i) {
    if (!grads[i].live()) grads[i] = ctx.allocate(params[i] * bf16);  // first use in this step
  };

  rng r(seed);
  for (std::size_t step = 0; step < steps; ++step) {
    const std::size_t s = 8 * r.uniform(seq_min / 8, seq_max / 8);
    const std::size_t t = micro_batch * s;  // tokens
    const std::size_t act = t * h * bf16;   // one hidden-sized activation

    // ---- forward
    buffer ids = ctx.allocate(t * 8);  // int64 token ids, kept until the embedding backward
    buffer x = ctx.allocate(act);      // embedding output = layer 0 input
    struct saved_layer {
      buffer ln1, stats1, qkv, attn, lse, x_mid, ln2, stats2, fc1, gelu, x_out;
    };
    std::vector<saved_layer> saved(layers);
    for (std::size_t l = 0; l < layers; ++l) {
      saved_layer& sv = saved[l];
      sv.ln1 = ctx.allocate(act);
      sv.stats1 = ctx.allocate(t * 2 * fp32);
      sv.qkv = ctx.allocate(3 * act);
      sv.attn = ctx.allocate(act);
      sv.lse = ctx.allocate(micro_batch * heads * s * fp32);
      buffer proj = ctx.allocate(act);
      sv.x_mid = ctx.allocate(act);  // x + proj
      ctx.deallocate(proj);
      sv.ln2 = ctx.allocate(act);
      sv.stats2 = ctx.allocate(t * 2 * fp32);
      sv.fc1 = ctx.allocate(t * ffn * bf16);
      sv.gelu = ctx.allocate(t * ffn * bf16);
      buffer fc2 = ctx.allocate(act);
      sv.x_out = ctx.allocate(act);  // x_mid + fc2 = next layer's input
      ctx.deallocate(fc2);
    }
    buffer lnf = ctx.allocate(act);
    buffer statsf = ctx.allocate(t * 2 * fp32);
    buffer logits = ctx.allocate(t * vocab * bf16);
    buffer logits32 = ctx.allocate(t * vocab * fp32);  // .float() before cross-entropy
    buffer logp = ctx.allocate(t * vocab * fp32);      // log_softmax, kept for backward
    ctx.deallocate(logits32);
    buffer loss = ctx.allocate(fp32);

    // ---- backward
    buffer g_logp = ctx.allocate(t * vocab * fp32);
    ctx.deallocate(logp);
    buffer g_logits = ctx.allocate(t * vocab * bf16);
    ctx.deallocate(g_logp);
    grad(0);  // LM head = embedding
    buffer g = ctx.allocate(act);
    ctx.deallocate(g_logits);
    ctx.deallocate(logits);
    grad(final_ln);
    grad(final_ln + 1);
    {
      buffer g_in = ctx.allocate(act);
      ctx.deallocate(g);
      g = g_in;
    }
    ctx.deallocate(statsf);
    ctx.deallocate(lnf);
    for (std::size_t li = layers; li-- > 0;) {
      saved_layer& sv = saved[li];
      // MLP: fc2, GELU, fc1, LayerNorm 2.
      grad(layer_param(li, 10));
      grad(layer_param(li, 11));
      buffer g_gelu = ctx.allocate(t * ffn * bf16);
      ctx.deallocate(sv.x_out);
      ctx.deallocate(sv.gelu);
      buffer g_fc1 = ctx.allocate(t * ffn * bf16);
      ctx.deallocate(g_gelu);
      grad(layer_param(li, 8));
      grad(layer_param(li, 9));
      buffer g_ln2 = ctx.allocate(act);
      ctx.deallocate(g_fc1);
      ctx.deallocate(sv.fc1);
      grad(layer_param(li, 6));
      grad(layer_param(li, 7));
      buffer g_mid = ctx.allocate(act);  // + the residual gradient, in place
      ctx.deallocate(g_ln2);
      ctx.deallocate(sv.ln2);
      ctx.deallocate(sv.stats2);
      ctx.deallocate(g);
      // Attention: output projection, flash attention, QKV, LayerNorm 1.
      grad(layer_param(li, 4));
      grad(layer_param(li, 5));
      buffer g_attn = ctx.allocate(act);
      ctx.deallocate(sv.x_mid);
      buffer dq_accum = ctx.allocate(t * h * fp32);  // flash-attention backward workspace
      buffer g_qkv = ctx.allocate(3 * act);
      ctx.deallocate(dq_accum);
      ctx.deallocate(g_attn);
      ctx.deallocate(sv.lse);
      ctx.deallocate(sv.attn);
      grad(layer_param(li, 2));
      grad(layer_param(li, 3));
      buffer g_ln1 = ctx.allocate(act);
      ctx.deallocate(g_qkv);
      ctx.deallocate(sv.qkv);
      grad(layer_param(li, 0));
      grad(layer_param(li, 1));
      g = ctx.allocate(act);  // gradient of the layer input (+ residual, in place)
      ctx.deallocate(g_ln1);
      ctx.deallocate(sv.ln1);
      ctx.deallocate(sv.stats1);
      ctx.deallocate(g_mid);
    }
    ctx.deallocate(g);
    ctx.deallocate(x);
    ctx.deallocate(ids);
    ctx.deallocate(loss);

    // ---- optimizer step (Adam state created on the first step), then zero_grad(set_to_none)
    if (exp_avg.empty()) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        exp_avg.push_back(ctx.allocate(params[i] * fp32));
        exp_avg_sq.push_back(ctx.allocate(params[i] * fp32));
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      buffer g32 = ctx.allocate(params[i] * fp32);  // grad.float()
      ctx.deallocate(g32);
    }
    for (buffer& b : grads) ctx.deallocate(b);
  }

  ctx.deallocate_all(exp_avg_sq);
  ctx.deallocate_all(exp_avg);
  ctx.deallocate_all(master);
  ctx.deallocate_all(weights);
}

// =================================================================================================
// (b) inference_kv_cache
//
// Pattern: LLM serving with a naively grown KV cache — continuous batching, where requests arrive
// and finish at any time and each request's per-layer K and V tensors grow with its sequence
// (Hugging Face transformers' DynamicCache concatenates on every token; here the growth comes in
// chunks of 256 tokens: allocate a larger buffer, copy, free the old one). Every request leaves
// holes of a different size when it finishes, and the growing buffers keep asking for sizes that
// no longer fit them. Paged KV caches (vLLM) were invented to avoid exactly this.
//
// Model: Llama-2-7B shapes in bf16 (32 layers, hidden 4096, 32 KV heads x 128, FFN 11008,
// vocabulary 32000): 12.6 GiB of weights allocated up front, one tensor per matrix; K and V cost
// 8 KiB per token per layer each. 256 requests, arriving 0..3 decode steps apart, prompt 32..2048
// tokens, output 16..1024 tokens, at most 32 running at once. Admission runs the prefill: per layer
// temporaries proportional to the prompt, including eager attention's heads x prompt x prompt
// score matrix (up to 512 MiB), and the first KV buffers. Each decode step has per-layer
// temporaries for the whole batch (normed input, QKV, padded attention scores, MLP) and fp32
// logits. Peak requested is 40 GiB (seed 1).
// =================================================================================================
inline void inference_kv_cache(workload_context& ctx, std::uint64_t seed) {
  constexpr std::size_t layers = 32, h = 4096, heads = 32, head_dim = 128, ffn = 11008;
  constexpr std::size_t vocab = 32000, bf16 = 2, fp32 = 4;
  constexpr std::size_t num_requests = 256, max_batch = 32, chunk = 256;
  constexpr std::size_t kv_token_bytes = heads * head_dim * bf16;  // one of K or V, one layer

  std::vector<buffer> weights;
  weights.push_back(ctx.allocate(vocab * h * bf16));  // embedding
  for (std::size_t l = 0; l < layers; ++l) {
    weights.push_back(ctx.allocate(h * bf16));                                    // input norm
    for (int m = 0; m < 4; ++m) weights.push_back(ctx.allocate(h * h * bf16));    // q, k, v, o
    weights.push_back(ctx.allocate(h * bf16));                                    // post norm
    for (int m = 0; m < 3; ++m) weights.push_back(ctx.allocate(h * ffn * bf16));  // gate, up, down
  }
  weights.push_back(ctx.allocate(h * bf16));          // final norm
  weights.push_back(ctx.allocate(vocab * h * bf16));  // LM head

  struct request {
    std::size_t arrival = 0, prompt = 0, output = 0;
    std::size_t generated = 0, capacity = 0;
    std::vector<buffer> k, v;  // one per layer
  };
  rng r(seed);
  std::vector<request> requests(num_requests);
  std::size_t clock = 0;
  for (request& q : requests) {
    clock += r.uniform(0, 3);
    q.arrival = clock;
    q.prompt = r.uniform(32, 2048);
    q.output = r.uniform(16, 1024);
  }

  auto round_up = [](std::size_t n, std::size_t m) { return (n + m - 1) / m * m; };
  auto grow = [&](request& q, std::size_t new_capacity) {
    for (std::size_t l = 0; l < layers; ++l) {
      for (std::vector<buffer>* kv : {&q.k, &q.v}) {
        buffer bigger = ctx.allocate(new_capacity * kv_token_bytes);
        if (q.capacity != 0) ctx.deallocate((*kv)[l]);  // after the copy
        (*kv)[l] = bigger;
      }
    }
    q.capacity = new_capacity;
  };

  std::size_t next = 0;  // first request not yet admitted
  std::vector<request*> running;
  for (std::size_t step = 0; next < requests.size() || !running.empty(); ++step) {
    // Admit arrived requests while there is room: prefill, one request at a time.
    while (next < requests.size() && requests[next].arrival <= step && running.size() < max_batch) {
      request& q = requests[next++];
      const std::size_t p = q.prompt;
      q.k.resize(layers);
      q.v.resize(layers);
      buffer x = ctx.allocate(p * h * bf16);
      for (std::size_t l = 0; l < layers; ++l) {
        buffer xn = ctx.allocate(p * h * bf16);
        buffer qkv = ctx.allocate(3 * p * h * bf16);
        if (l == 0) grow(q, round_up(p + 1, chunk));         // KV written layer by layer in reality
        buffer scores = ctx.allocate(heads * p * p * fp32);  // eager attention, fp32 softmax
        buffer attn = ctx.allocate(p * h * bf16);
        ctx.deallocate(scores);
        ctx.deallocate(qkv);
        buffer o = ctx.allocate(p * h * bf16);
        ctx.deallocate(attn);
        ctx.deallocate(xn);
        buffer gate_up = ctx.allocate(2 * p * ffn * bf16);
        buffer a = ctx.allocate(p * ffn * bf16);
        ctx.deallocate(gate_up);
        buffer down = ctx.allocate(p * h * bf16);
        ctx.deallocate(a);
        ctx.deallocate(down);
        ctx.deallocate(o);
      }
      buffer logits = ctx.allocate(vocab * fp32);  // last position only
      ctx.deallocate(logits);
      ctx.deallocate(x);
      q.generated = 1;
      running.push_back(&q);
    }
    if (running.empty()) continue;

    // One decode step for the whole batch.
    const std::size_t b = running.size();
    std::size_t longest = 0;
    for (request* q : running) {
      const std::size_t len = q->prompt + q->generated;
      if (len + 1 > q->capacity) grow(*q, q->capacity + chunk);
      if (len + 1 > longest) longest = len + 1;
    }
    buffer x = ctx.allocate(b * h * bf16);
    for (std::size_t l = 0; l < layers; ++l) {
      buffer xn = ctx.allocate(b * h * bf16);
      buffer qkv = ctx.allocate(3 * b * h * bf16);
      buffer scores = ctx.allocate(b * heads * longest * fp32);  // padded to the longest
      buffer attn = ctx.allocate(b * h * bf16);
      ctx.deallocate(scores);
      ctx.deallocate(qkv);
      ctx.deallocate(xn);
      buffer o = ctx.allocate(b * h * bf16);
      ctx.deallocate(attn);
      buffer gate_up = ctx.allocate(2 * b * ffn * bf16);
      buffer a = ctx.allocate(b * ffn * bf16);
      ctx.deallocate(gate_up);
      buffer down = ctx.allocate(b * h * bf16);
      ctx.deallocate(a);
      ctx.deallocate(down);
      ctx.deallocate(o);
    }
    buffer logits = ctx.allocate(b * vocab * fp32);
    buffer probs = ctx.allocate(b * vocab * fp32);
    ctx.deallocate(logits);
    buffer tokens = ctx.allocate(b * 8);
    ctx.deallocate(probs);
    ctx.deallocate(tokens);
    ctx.deallocate(x);

    // Retire finished requests, freeing their KV cache.
    std::vector<request*> still;
    for (request* q : running) {
      ++q->generated;
      if (q->generated >= q->output) {
        ctx.deallocate_all(q->v);
        ctx.deallocate_all(q->k);
      } else {
        still.push_back(q);
      }
    }
    running.swap(still);
  }
  ctx.deallocate_all(weights);
}

// =================================================================================================
// (c) two_pass_weights
//
// Pattern: weights post-processed in two passes of different sizes at startup — GPT-OSS 120B's
// MXFP4 MoE weights in vLLM (36 layers, tensor-parallel 2, on each GPU): the w13 (gate+up) pass
// produces 530 MiB tensors, the w2 (down) pass 270 MiB ones. Source: vllm-project/vllm PR #41268
// ("Fix OOM by setting PyTorch max_split_size_mb during model loading", against PyTorch 2.10):
// "When PyTorch processes the 270 MiB w2 weights, it finds cached 530 MiB segments left over from
// w13 processing and places the 270 MiB tensor inside ... creating a 260 MiB free remainder ...
// too small for another 530 MiB or 270 MiB allocation, and [it] cannot be freed because the
// 270 MiB weight pins the segment." vLLM's fix is max_split_size_mb:20 during loading.
//
// Sequence (the PR describes the effect, not every call; this is a faithful reconstruction):
//  1. w13 pass: per layer, the converted 530 MiB w13 (kept) and a 530 MiB staging tensor in the
//     checkpoint layout, held by the loader until the pass is over;
//  2. w2 pass: per layer, the loader drops one 530 MiB staging tensor, then the converted 270 MiB
//     w2 is allocated (kept) — it lands in the freed 530 MiB block and splits it;
//  3. the engine then allocates its KV cache, one 512 MiB tensor per layer, which fits neither
//     the 260 MiB remainders nor anything else cached.
// No randomness: the seed is unused. Peak requested is 46.1 GiB.
// =================================================================================================
inline void two_pass_weights(workload_context& ctx, std::uint64_t /*seed*/) {
  constexpr std::size_t layers = 36;
  constexpr std::size_t w13_bytes = 530 * mib, w2_bytes = 270 * mib, kv_bytes = 512 * mib;
  std::vector<buffer> w13, staging, w2, kv;
  for (std::size_t l = 0; l < layers; ++l) {
    w13.push_back(ctx.allocate(w13_bytes));
    staging.push_back(ctx.allocate(w13_bytes));
  }
  for (std::size_t l = 0; l < layers; ++l) {
    ctx.deallocate(staging[l]);
    w2.push_back(ctx.allocate(w2_bytes));
  }
  staging.clear();
  for (std::size_t l = 0; l < layers; ++l) kv.push_back(ctx.allocate(kv_bytes));
  ctx.deallocate_all(kv);
  ctx.deallocate_all(w2);
  ctx.deallocate_all(w13);
}

// =================================================================================================
// (d) split_survivor_123548
//
// Pattern: two large blocks freed around a small survivor, repeated — the reproducer of PyTorch
// issue #123548 (pytorch/pytorch; the self-contained reproducer in the thread and in PR #193400):
// with max_split_size_mb:128 and expandable_segments:True, "reserved grows by about 138 MiB per
// cycle ... while allocated stays between 66 and 306 MiB". Each cycle allocates A = 91 MiB and
// B = 45.5 MiB, then a 2 MiB block that stays alive, then frees A and B; a 64 MiB buffer allocated
// first stays alive throughout (the reproducer's canary; allocated starts at 66 MiB). The survivor
// fences the merged 136.5 MiB free region off from an expandable segment's tail, and the
// max_split_size rule (blocks >= max_split_size are not split for smaller requests) keeps the
// next cycle from reusing it. Under segment-per-cudaMalloc (classic) allocation, A, B and the
// survivors live in separate segments and nothing is fenced. 2,000 cycles: 3.9 GiB of survivors,
// 4.1 GiB peak requested.
// No randomness: the seed is unused. Run it with max_split_size_mb:128 to see the interaction.
// =================================================================================================
inline void split_survivor_123548(workload_context& ctx, std::uint64_t /*seed*/) {
  constexpr std::size_t cycles = 2000;
  std::vector<buffer> survivors;
  survivors.reserve(cycles);
  buffer canary = ctx.allocate(64 * mib);
  for (std::size_t c = 0; c < cycles; ++c) {
    buffer a = ctx.allocate(91 * mib);
    buffer b = ctx.allocate(91 * mib / 2);  // 45.5 MiB
    survivors.push_back(ctx.allocate(2 * mib));
    ctx.deallocate(a);
    ctx.deallocate(b);
  }
  ctx.deallocate_all(survivors);
  ctx.deallocate(canary);
}

// =================================================================================================
// (e) inference_varying_inputs
//
// Pattern: a vision transformer serving images of varying resolution, one request batch at a time,
// with torch.cuda.empty_cache() after each batch (what servers do to give memory back between
// requests, and what makes PyTorch's allocator start over). Activations are sized by the number
// of patches, which changes with every batch, so no two batches ask for the same sizes.
//
// Model: ViT-L/16 (24 layers, hidden 1024, 16 heads, MLP 4096), fp16 weights (0.6 GiB). Each batch
// holds 1..16 images of 224..640 pixels per side (multiples of 32); inference keeps one layer's
// activations at a time (QKV, attention scores, the MLP's hidden layer), then the classifier head.
// 24 batches (seed 1).
// =================================================================================================
inline void inference_varying_inputs(workload_context& ctx, std::uint64_t seed) {
  constexpr std::size_t layers = 24, h = 1024, heads = 16, mlp = 4096, fp16 = 2, classes = 1000;
  constexpr std::size_t batches = 24;
  rng r(seed);
  std::vector<buffer> weights;
  weights.push_back(ctx.allocate(768 * h * fp16));  // patch embedding
  for (std::size_t l = 0; l < layers; ++l) {
    weights.push_back(ctx.allocate(3 * h * h * fp16));                      // qkv
    weights.push_back(ctx.allocate(h * h * fp16));                          // output projection
    weights.push_back(ctx.allocate(h * mlp * fp16));                        // fc1
    weights.push_back(ctx.allocate(mlp * h * fp16));                        // fc2
    for (int n = 0; n < 4; ++n) weights.push_back(ctx.allocate(h * fp16));  // norms
  }
  weights.push_back(ctx.allocate(h * classes * fp16));  // head
  for (std::size_t b = 0; b < batches; ++b) {
    const std::size_t images = r.uniform(1, 16);
    const std::size_t side = 32 * r.uniform(7, 20);
    const std::size_t tokens = images * ((side / 16) * (side / 16) + 1);
    buffer x = ctx.allocate(tokens * h * fp16);
    for (std::size_t l = 0; l < layers; ++l) {
      buffer norm = ctx.allocate(tokens * h * fp16);
      buffer qkv = ctx.allocate(3 * tokens * h * fp16);
      ctx.deallocate(norm);
      buffer scores = ctx.allocate(images * heads * (tokens / images) * (tokens / images) * fp16);
      buffer attn = ctx.allocate(tokens * h * fp16);
      ctx.deallocate(scores);
      ctx.deallocate(qkv);
      buffer y = ctx.allocate(tokens * h * fp16);  // x + proj(attn)
      ctx.deallocate(attn);
      ctx.deallocate(x);
      buffer hidden = ctx.allocate(tokens * mlp * fp16);
      buffer out = ctx.allocate(tokens * h * fp16);
      ctx.deallocate(hidden);
      ctx.deallocate(y);
      x = out;
    }
    buffer logits = ctx.allocate(images * classes * 4);
    ctx.deallocate(x);
    ctx.deallocate(logits);
    ctx.empty_cache();
  }
  ctx.deallocate_all(weights);
}

// =================================================================================================
// (f) offload_streams
//
// Pattern: inference of a model larger than the GPU with its weights offloaded to host memory:
// each layer's weights are copied in on one of several copy streams (round robin, to overlap the
// transfers), two layers ahead of the compute stream, used there (Tensor.record_stream, as the
// offloading engines do) and freed after the layer. Memory freed on one stream is wanted on
// another all the time.
//
// Model: Llama-2-13B shapes (40 layers, hidden 5120, FFN 13824), fp16; 10 copy streams; a
// 512-token prompt (batch 4) then 32 decoding steps, each of which streams all 40 layers in again.
// =================================================================================================
inline void offload_streams(workload_context& ctx, std::uint64_t /*seed*/) {
  constexpr std::size_t layers = 40, h = 5120, ffn = 13824, fp16 = 2, batch = 4, prompt = 512;
  constexpr std::size_t copy_streams = 10, ahead = 2, decode_steps = 32;
  constexpr stream_id compute = 0;
  std::size_t next_copy = 0;
  auto load = [&](std::vector<buffer>& into) {
    const stream_id s = static_cast<stream_id>(1 + next_copy++ % copy_streams);
    into.push_back(ctx.allocate(4 * h * h * fp16, s));    // q, k, v, o in one buffer
    into.push_back(ctx.allocate(3 * h * ffn * fp16, s));  // gate, up, down in one buffer
    into.push_back(ctx.allocate(2 * h * fp16, s));        // the two norms
  };
  auto pass = [&](std::size_t tokens) {
    std::vector<std::vector<buffer>> loaded(layers);
    for (std::size_t l = 0; l < ahead && l < layers; ++l) load(loaded[l]);
    buffer x = ctx.allocate(tokens * h * fp16, compute);
    for (std::size_t l = 0; l < layers; ++l) {
      if (l + ahead < layers) load(loaded[l + ahead]);
      for (const buffer& w : loaded[l]) ctx.record_stream(w, compute);
      buffer qkv = ctx.allocate(3 * tokens * h * fp16, compute);
      buffer attn = ctx.allocate(tokens * h * fp16, compute);
      ctx.deallocate(qkv);
      buffer gate_up = ctx.allocate(2 * tokens * ffn * fp16, compute);
      buffer out = ctx.allocate(tokens * h * fp16, compute);
      ctx.deallocate(gate_up);
      ctx.deallocate(attn);
      ctx.deallocate(x);
      x = out;
      ctx.deallocate_all(loaded[l]);
    }
    ctx.deallocate(x);
  };
  pass(batch * prompt);
  for (std::size_t t = 0; t < decode_steps; ++t) pass(batch);
}

// =================================================================================================
// (g) calibration_layers
//
// Pattern: post-training quantization calibration (GPTQ-style) of a decoder, layer by layer: a
// layer's weights are loaded, the calibration samples run through it while each linear layer
// accumulates a Hessian (in_features x in_features, fp32), then the layer is quantized (a few
// temporaries) and the Hessians are freed before the next layer. The large, long-lived
// accumulators come and go once per layer, between small per-sample activations.
//
// Model: Qwen2-1.5B shapes (28 layers, hidden 1536, FFN 8960, GQA with 2 KV heads of 128), fp16
// weights; 64 calibration samples of 2048 tokens, 8 at a time.
// =================================================================================================
inline void calibration_layers(workload_context& ctx, std::uint64_t /*seed*/) {
  constexpr std::size_t layers = 28, h = 1536, ffn = 8960, kv = 2 * 128, fp16 = 2, fp32 = 4;
  constexpr std::size_t samples = 64, per_batch = 8, tokens = 2048;
  buffer hidden_states = ctx.allocate(samples * tokens * h * fp16);  // the inputs of the layer
  for (std::size_t l = 0; l < layers; ++l) {
    std::vector<buffer> w;
    w.push_back(ctx.allocate(h * h * fp16));        // q
    w.push_back(ctx.allocate(2 * h * kv * fp16));   // k, v
    w.push_back(ctx.allocate(h * h * fp16));        // o
    w.push_back(ctx.allocate(2 * h * ffn * fp16));  // gate, up
    w.push_back(ctx.allocate(ffn * h * fp16));      // down
    std::vector<buffer> hessians;
    for (std::size_t in : {h, h, h, h, ffn}) hessians.push_back(ctx.allocate(in * in * fp32));
    buffer outputs = ctx.allocate(samples * tokens * h * fp16);
    for (std::size_t b = 0; b < samples / per_batch; ++b) {
      const std::size_t t = per_batch * tokens;
      buffer x = ctx.allocate(t * h * fp32);  // upcast input for the Hessian update
      buffer qkv = ctx.allocate(t * (h + 2 * kv) * fp16);
      buffer attn = ctx.allocate(t * h * fp16);
      ctx.deallocate(qkv);
      buffer mid = ctx.allocate(t * 2 * ffn * fp16);
      buffer act = ctx.allocate(t * ffn * fp32);  // the down projection's input, for its Hessian
      ctx.deallocate(mid);
      ctx.deallocate(act);
      ctx.deallocate(attn);
      ctx.deallocate(x);
    }
    for (std::size_t i = 0; i < w.size(); ++i) {  // quantize each linear layer
      buffer inverse = ctx.allocate(hessians[std::min<std::size_t>(i, 4)].bytes);
      buffer quantized = ctx.allocate(w[i].bytes / 4);
      ctx.deallocate(inverse);
      ctx.deallocate(quantized);
    }
    ctx.deallocate_all(hessians);
    ctx.deallocate_all(w);
    ctx.deallocate(hidden_states);
    hidden_states = outputs;  // the next layer's inputs
  }
  ctx.deallocate(hidden_states);
}

// =================================================================================================
// (h) conv3d_training
//
// Pattern: a training step of a 3D-convolution network on volumes (medical imaging, video): a 3D
// U-Net whose activations are whole volumes, with a cuDNN workspace of a different size for each
// convolution algorithm, skip connections that live from the encoder to the decoder, and a
// backward pass that frees them in reverse.
//
// Model: 3D U-Net, 4 levels, 32..256 channels, fp16 activations, batch 2 of 128^3 volumes, two
// convolutions per level with batch norm and ReLU; Adam over 19M parameters (fp32 state).
// =================================================================================================
inline void conv3d_training(workload_context& ctx, std::uint64_t seed) {
  constexpr std::size_t levels = 4, batch = 2, side = 128, fp16 = 2, fp32 = 4;
  rng r(seed);
  std::vector<buffer> params, exp_avg, exp_avg_sq;
  std::vector<std::size_t> param_bytes;
  for (std::size_t l = 0; l < levels; ++l) {
    const std::size_t c = 32u << l;
    for (std::size_t bytes : {27 * c * c * fp32, 27 * c * c * fp32, 4 * c * fp32}) {
      params.push_back(ctx.allocate(bytes));
      param_bytes.push_back(bytes);
    }
  }
  auto workspace = [&] { return ctx.allocate(mib * r.uniform(8, 256)); };
  auto volume = [&](std::size_t level, std::size_t channels) {
    const std::size_t s = side >> level;
    return batch * channels * s * s * s * fp16;
  };
  std::vector<buffer> saved;  // kept for backward
  buffer x = ctx.allocate(volume(0, 1));
  for (std::size_t l = 0; l < levels; ++l) {  // encoder
    const std::size_t c = 32u << l;
    for (int conv = 0; conv < 2; ++conv) {
      buffer ws = workspace();
      buffer y = ctx.allocate(volume(l, c));
      ctx.deallocate(ws);
      buffer bn = ctx.allocate(volume(l, c));
      saved.push_back(y);
      saved.push_back(bn);  // ReLU in place
    }
    if (l + 1 < levels) saved.push_back(ctx.allocate(volume(l + 1, c)));  // pooled
  }
  for (std::size_t l = levels - 1; l-- > 0;) {  // decoder
    const std::size_t c = 32u << l;
    saved.push_back(ctx.allocate(volume(l, c)));      // upsampled
    saved.push_back(ctx.allocate(volume(l, 2 * c)));  // concatenated with the skip connection
    buffer ws = workspace();
    saved.push_back(ctx.allocate(volume(l, c)));
    ctx.deallocate(ws);
  }
  buffer loss = ctx.allocate(volume(0, 1) * 2);
  std::vector<buffer> grads;
  for (std::size_t i = saved.size(); i-- > 0;) {  // backward frees what forward saved
    buffer ws = workspace();
    buffer grad_in = ctx.allocate(saved[i].bytes);
    ctx.deallocate(ws);
    ctx.deallocate(saved[i]);
    ctx.deallocate(grad_in);
    if (grads.size() < params.size() && i % 2 == 0) {
      grads.push_back(ctx.allocate(param_bytes[grads.size()]));
    }
  }
  while (grads.size() < params.size()) grads.push_back(ctx.allocate(param_bytes[grads.size()]));
  saved.clear();
  ctx.deallocate(loss);
  ctx.deallocate(x);
  for (std::size_t i = 0; i < params.size(); ++i) {  // Adam's state, made by the first step
    exp_avg.push_back(ctx.allocate(param_bytes[i]));
    exp_avg_sq.push_back(ctx.allocate(param_bytes[i]));
  }
  ctx.deallocate_all(grads);
  ctx.deallocate_all(exp_avg_sq);
  ctx.deallocate_all(exp_avg);
  ctx.deallocate_all(params);
}

// =================================================================================================
// Registry

/// A named workload. `run` is deterministic in `seed`.
struct workload_info {
  std::string_view name;
  std::string_view summary;  ///< one line
  void (*run)(workload_context& ctx, std::uint64_t seed);
};

inline const std::array<workload_info, 8>& all_workloads() {
  static const std::array<workload_info, 8> list{{
      {"llm_training_varlen",
       "1.3B-parameter GPT training, bf16 + fp32 Adam, seq_len 128..4096 drawn per step",
       &llm_training_varlen},
      {"inference_kv_cache",
       "Llama-2-7B serving, continuous batching, KV cache grown in 256-token chunks",
       &inference_kv_cache},
      {"two_pass_weights",
       "GPT-OSS 120B startup: 530 MiB then 270 MiB weight passes, then the KV cache",
       &two_pass_weights},
      {"split_survivor_123548",
       "PyTorch #123548: 91 MiB + 45.5 MiB freed around a 2 MiB survivor, 2,000 times",
       &split_survivor_123548},
      {"inference_varying_inputs",
       "ViT-L/16 serving 24 batches of 1..16 images of 224..640 px, empty_cache after each",
       &inference_varying_inputs},
      {"offload_streams",
       "Llama-2-13B with offloaded weights, 10 copy streams, prompt then 32 decode steps",
       &offload_streams},
      {"calibration_layers",
       "Qwen2-1.5B quantization calibration, layer by layer, Hessians per linear layer",
       &calibration_layers},
      {"conv3d_training", "3D U-Net training step, batch 2 of 128^3 volumes, cuDNN workspaces",
       &conv3d_training},
  }};
  return list;
}

/// The workload called `name`, or nullptr.
inline const workload_info* find_workload(std::string_view name) {
  for (const workload_info& w : all_workloads()) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

}  // namespace gpumem::bench
