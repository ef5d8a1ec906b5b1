// Prediction: top-k labels and their scores (softmax probabilities, or per-label sigmoids
// for a sigmoid output layer). Three paths: the batched dense path of
// training (small dense networks), a blocked exact scorer for wide dense output layers (a
// block of samples shares each pass over the output matrix), and per sample through the
// phases of sample_step.hpp (hash-selected output neurons, or all of them).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "engine_internal.hpp"
#include "slide/network.hpp"
#include "slide/bf16.hpp"
#include "slide/sample_step.hpp"

namespace slide {

namespace {

using Scored = std::pair<float, int32_t>;
// "Better" = higher score, ties to the lower label id; a top-k heap keeps its worst in front.
inline bool better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}
inline void heap_offer(std::vector<Scored>& heap, size_t k, Scored c) {
  if (heap.size() < k) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), better);
  } else if (better(c, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), better);
    heap.back() = c;
    std::push_heap(heap.begin(), heap.end(), better);
  }
}

// Workspaces of one prediction call, from the pool (several threads may predict at once);
// returned when the call ends, also by an exception.
struct WorkspaceCheckout {
  PredictCache& pool;
  std::vector<std::unique_ptr<SampleWorkspace>> wss;
  WorkspaceCheckout(PredictCache& cache, const std::vector<Layer>& layers, int n) : pool(cache) {
    for (int t = 0; t < n; ++t) wss.push_back(pool.take(layers));
  }
  WorkspaceCheckout(const WorkspaceCheckout&) = delete;
  WorkspaceCheckout& operator=(const WorkspaceCheckout&) = delete;
  ~WorkspaceCheckout() {
    for (auto& ws : wss)
      if (ws) pool.give(std::move(ws));
  }
};

// The score of logit z under an output layer trained with per-label binary cross-entropy
// (softmax layers report exp(z - max) / sum, computed where the normaliser is known).
inline float sigmoid_score(float z) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z)))); }

}  // namespace

void Network::predict_exact_blocked(const CsrView& x, int k, int32_t* out_labels, float* out_scores,
                                    SoftmaxStats* stats) const {
  // The output matrix is far larger than the caches, so a per-sample pass over it is bound
  // by memory bandwidth: a block of samples shares each pass (every row is read once per
  // block), with an online softmax normaliser and top-k per sample. Blocks of up to 64 samples
  // (at least 16; fewer than 64 when that would leave a thread without a block), two rows at a
  // time, with AVX-512 two samples a register: against blocks of 16 and one row at a time, 1.7x
  // the points/s on 20,000 rows of 1,024 and 1.3-1.4x on 670,091 rows of 128 (2 threads, AVX-512;
  // AVX2 alone: 1.4x and about 1x; benchmarks/exact_scoring.py). A block size that is a multiple
  // of 4 keeps every score the same bits (Kernels::dot_multi takes 4 vectors at a time).
  constexpr int64_t kMaxBlock = 64;
  constexpr int64_t kRowChunk = 1024;
  // Z holds a chunk's scores sample after sample, kZStride floats apart: at exactly 4 KiB the
  // scores of one row for the samples of a block would all share one set of the L1 cache.
  constexpr int64_t kZStride = kRowChunk + 16;
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const Layer& out = layers_.back();
  const int64_t len = out.row_len, N = out.out_dim;
  const int64_t hld = len + 16;  // H holds the block's hidden vectors hld floats apart, likewise
  const float* W = out.weight.data();
  const float* bias = out.bias.data();
  const bool sigmoid = out.spec.activation == Activation::Sigmoid;
  const int64_t per_thread = (x.n + std::max(1, threads_) - 1) / std::max(1, threads_);
  const int64_t block = std::clamp<int64_t>((per_thread + 3) / 4 * 4, 16, kMaxBlock);
  const int64_t blocks = (x.n + block - 1) / block;
  const int nt = static_cast<int>(std::min<int64_t>(threads_, blocks));  // a block is one thread's work
  // With AVX-512, whole groups of four samples are scored from H2, their vectors interleaved in
  // pairs (Kernels::dot_multi2_pairs: the same bits as dot_multi2 on H).
  const bool pairs = kr.dot_multi2_pairs != nullptr && len % 8 == 0 && !out.bf16;
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(nt) if (nt > 1 && x.n * sample_work_ > kParallelWork)
  {
    std::unique_ptr<SampleWorkspace> wsp;
    std::vector<float> H, H2, Z, wide;  // wide: a bf16 row widened to float32
    std::vector<std::vector<Scored>> heaps(block);
    catcher.run([&] {
      wsp = make_workspace(layers_, false, false);
      H.resize(block * hld);
      if (pairs) H2.resize(block * len);
      Z.resize(block * kZStride);
      if (out.bf16) wide.resize(len);
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        const int64_t s0 = blk * block, ns = std::min(block, x.n - s0);
        for (int64_t s = 0; s < ns; ++s) {
          const int64_t i = s0 + s, a = x.indptr[i];
          Rng rng(0);  // unused: no sampling and no dropout here
          forward_hidden(layers_, *wsp, kr, SparseRow{x.indices + a, x.values + a, x.indptr[i + 1] - a}, false, 0.0f,
                         rng, nullptr);
          std::copy(wsp->out[nl - 2].begin(), wsp->out[nl - 2].end(), H.begin() + s * hld);
          heaps[s].clear();
        }
        const int64_t ns4 = pairs ? ns / 4 * 4 : 0;  // samples scored from H2
        if (ns4) interleave_pairs(H.data(), hld, ns4 / 2, len, H2.data());
        float mx[kMaxBlock];
        double sum[kMaxBlock];
        for (int64_t s = 0; s < ns; ++s) {
          mx[s] = -INFINITY;
          sum[s] = 0.0;
        }
        for (int64_t c = 0; c < N; c += kRowChunk) {
          const int64_t cl = std::min(kRowChunk, N - c);
          float d[kMaxBlock], e[kMaxBlock];
          for (int64_t r = 0; r < cl;) {
            if (!out.bf16 && r + 1 < cl) {
              // Two rows at a time: each vector of the block is loaded once for both.
              const float* w = W + (c + r) * len;
              if (r + 5 < cl) prefetch_row(w + 4 * len, 2 * len);
              if (ns4) kr.dot_multi2_pairs(w, w + len, H2.data(), ns4, len, d, e);
              if (ns4 < ns) kr.dot_multi2(w, w + len, H.data() + ns4 * hld, hld, ns - ns4, len, d + ns4, e + ns4);
              for (int64_t s = 0; s < ns; ++s) {
                Z[s * kZStride + r] = d[s] + bias[c + r];
                Z[s * kZStride + r + 1] = e[s] + bias[c + r + 1];
              }
              r += 2;
              continue;
            }
            const float* w;
            if (out.bf16) {
              // Exact scores of the stored bf16 weights: the row widened, the inputs in float32.
              if (r + 4 < cl) prefetch_row(reinterpret_cast<const float*>(out.row16(c + r + 4)), len / 2);
              kr.from_bf16(out.row16(c + r), wide.data(), len);
              w = wide.data();
            } else {
              w = W + (c + r) * len;
            }
            kr.dot_multi(w, H.data(), hld, ns, len, d);
            for (int64_t s = 0; s < ns; ++s) Z[s * kZStride + r] = d[s] + bias[c + r];
            ++r;
          }
          for (int64_t s = 0; s < ns; ++s) {
            const float* z = Z.data() + s * kZStride;
            float cm = mx[s];
            for (int64_t r = 0; r < cl; ++r) cm = std::max(cm, z[r]);
            if (cm > mx[s]) {
              sum[s] *= std::exp(static_cast<double>(mx[s]) - cm);
              mx[s] = cm;
            }
            sum[s] += kr.exp_sum(z, cl, cm);
            std::vector<Scored>& heap = heaps[s];
            for (int64_t r = 0; r < cl; ++r)
              if (heap.size() < static_cast<size_t>(k) || z[r] >= heap.front().first)
                heap_offer(heap, k, Scored(z[r], static_cast<int32_t>(c + r)));
          }
        }
        for (int64_t s = 0; s < ns; ++s) {
          std::vector<Scored>& heap = heaps[s];
          std::sort_heap(heap.begin(), heap.end(), better);
          int32_t* lab = out_labels + (s0 + s) * k;
          float* sc = out_scores + (s0 + s) * k;
          if (stats) stats[s0 + s] = SoftmaxStats{mx[s], sum[s]};
          for (int j = 0; j < k; ++j) {
            lab[j] = j < static_cast<int>(heap.size()) ? heap[j].second : -1;
            sc[j] = j >= static_cast<int>(heap.size()) ? 0.0f
                  : sigmoid ? sigmoid_score(heap[j].first)
                            : static_cast<float>(std::exp(heap[j].first - mx[s]) / sum[s]);
          }
        }
      });
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
}

void Network::predict_layerwise(const CsrView& x, int k, int32_t* out_labels, float* out_scores,
                                SoftmaxStats* stats, float* logits) const {
  // Blocks of samples through the dense layers as matrix products, as in training.
  constexpr int64_t kBlock = 128;
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const Layer& first = layers_[0];
  const int64_t w0 = first.out_dim;
  const bool sigmoid = layers_.back().spec.activation == Activation::Sigmoid;
  const int64_t blocks = (x.n + kBlock - 1) / kBlock;
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (x.n * sample_work_ > kParallelWork)
  {
    std::vector<std::vector<float>> act(static_cast<size_t>(nl));
    std::vector<Scored> heap;
    std::vector<float> wide;  // a block of bf16 weight rows widened to float32
    catcher.run([&] {
      for (int l = 0; l < nl; ++l) act[l].resize(static_cast<size_t>(kBlock * layers_[l].out_dim));
      for (int l = 1; l < nl; ++l)
        if (layers_[l].bf16) wide.resize(std::max(wide.size(), static_cast<size_t>(kForwardRows * layers_[l].in_dim)));
      heap.reserve(static_cast<size_t>(k) + 1);
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (catcher.failed() || poller.should_stop()) continue;
      const int64_t s0 = blk * kBlock, ns = std::min(kBlock, x.n - s0);
      Rng unused(0);  // no dropout at inference
      for (int64_t s = 0; s < ns; ++s) {
        const int64_t a = x.indptr[s0 + s], nnz = x.indptr[s0 + s + 1] - a;
        float* z = act[0].data() + s * w0;
        std::copy(first.bias.data(), first.bias.data() + w0, z);
        for (int64_t q = 0; q < nnz; ++q) {
          const int64_t row = static_cast<int64_t>(x.indices[a + q]);
          if (first.bf16)
            kr.axpy_bf16(x.values[a + q], first.row16(row), z, w0);
          else
            kr.axpy(x.values[a + q], first.weight.data() + row * first.row_len, z, w0);
        }
        if (nl > 1) activate(first.spec.activation, z, nullptr, w0, 0.0f, unused);
      }
      for (int l = 1; l < nl; ++l) {
        const Layer& L = layers_[l];
        const int64_t out = L.out_dim, in = L.in_dim;
        for (int64_t j0 = 0; j0 < out; j0 += kForwardRows) {
          const int64_t nj = std::min(kForwardRows, out - j0);
          const float* Wj = L.weight.data() + j0 * in;
          if (L.bf16) {
            kr.from_bf16(L.row16(j0), wide.data(), nj * in);
            Wj = wide.data();
          }
          kr.matmul_bt(act[l - 1].data(), in, Wj, in, act[l].data() + j0, out, ns, nj, in);
        }
        for (int64_t s = 0; s < ns; ++s) {
          float* z = act[l].data() + s * out;
          for (int64_t j = 0; j < out; ++j) z[j] += L.bias[j];
          if (l + 1 < nl) activate(L.spec.activation, z, nullptr, out, 0.0f, unused);
        }
      }
      const int64_t out = layers_.back().out_dim;
      if (logits) std::copy(act[nl - 1].data(), act[nl - 1].data() + ns * out, logits + s0 * out);
      for (int64_t s = 0; s < ns; ++s) {
        const float* z = act[nl - 1].data() + s * out;
        float mx = z[0];
        for (int64_t j = 1; j < out; ++j) mx = std::max(mx, z[j]);
        const double sum = kr.exp_sum(z, out, mx);
        if (stats) stats[s0 + s] = SoftmaxStats{mx, sum};
        heap.clear();
        for (int64_t j = 0; j < out; ++j)
          if (heap.size() < static_cast<size_t>(k) || z[j] >= heap.front().first)
            heap_offer(heap, static_cast<size_t>(k), Scored(z[j], static_cast<int32_t>(j)));
        std::sort_heap(heap.begin(), heap.end(), better);
        int32_t* lab = out_labels + (s0 + s) * k;
        float* sc = out_scores + (s0 + s) * k;
        for (int j = 0; j < k; ++j) {
          const bool have = j < static_cast<int>(heap.size());
          lab[j] = have ? heap[j].second : -1;
          sc[j] = !have ? 0.0f
                : sigmoid ? sigmoid_score(heap[j].first)
                          : static_cast<float>(std::exp(static_cast<double>(heap[j].first) - mx) / sum);
        }
      }
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
}

void Network::predict_topk(const CsrView& x, int k, bool use_lsh, int32_t* out_labels, float* out_scores,
                           SoftmaxStats* stats, const LshQuery& query) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (k < 1) throw InvalidArgument("k: must be >= 1, got " + std::to_string(k));
  if (query.candidates < 0 || query.candidates > INT32_MAX / 2)
    throw InvalidArgument("candidates: must be in [0, 2^30), got " + std::to_string(query.candidates));
  if (query.prior < 0 || query.prior > INT32_MAX / 2)
    throw InvalidArgument("prior: must be in [0, 2^30), got " + std::to_string(query.prior));
  const Layer& out = layers_.back();
  use_lsh = use_lsh && out.lsh();
  if (batch_ && out.out_dim <= kMaxRecordedWidth)
    predict_layerwise(x, k, out_labels, out_scores, stats);
  else if (!use_lsh && !out.sparse_input && out.out_dim > kMaxRecordedWidth)
    predict_exact_blocked(x, k, out_labels, out_scores, stats);
  else
    predict_samples(x, k, use_lsh, out_labels, out_scores, stats, query);
  // A shard's neurons are labels shard_begin_ onwards.
  if (shard_begin_ != 0)
    for (int64_t i = 0; i < x.n * k; ++i)
      if (out_labels[i] >= 0) out_labels[i] += static_cast<int32_t>(shard_begin_);
}

void Network::predict_samples(const CsrView& x, int k, bool use_lsh, int32_t* out_labels, float* out_scores,
                              SoftmaxStats* stats, const LshQuery& query) const {
  // One sample at a time through the phases of sample_step.hpp: hidden layers, then the
  // output neurons (hash-selected when use_lsh, all otherwise) and their softmax.
  const Kernels& kr = kernels();
  const Layer& out = layers_.back();
  const NeuronRange all{0, out.out_dim};
  const bool sigmoid = out.spec.activation == Activation::Sigmoid;
  SelectionParams sel = out.spec.selection;
  if (query.candidates > 0) {
    // The candidates most tables agree on: a random fill or a uniform cut of the union would
    // spend the budget on neurons no more likely to score high than any other.
    sel.mode = Selection::TopK;
    sel.min_active = 0;
    sel.max_active = static_cast<int>(query.candidates);
  }
  // The prior labels go in as forced neurons (first, always kept), on top of the hash budget.
  std::shared_ptr<const std::vector<int32_t>> prior;
  if (use_lsh && query.prior > 0) prior = predict_cache_->prior(out, step_);
  const int n_prior = prior ? static_cast<int>(std::min<int64_t>(query.prior, prior->size())) : 0;
  if (sel.max_active > 0) sel.max_active += n_prior;
  // One sample runs on the calling thread: waking a team costs more than the query.
  const int nt = x.n > 1 && x.n * sample_work_ > kParallelWork ? static_cast<int>(std::min<int64_t>(threads_, x.n)) : 1;
  WorkspaceCheckout checkout(*predict_cache_, layers_, nt);
  std::vector<std::unique_ptr<SampleWorkspace>>& wss = checkout.wss;
  const int nl = static_cast<int>(layers_.size());
  {
    InterruptPoller poller;
    ExceptionCatcher catcher;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      SampleWorkspace& ws = *wss[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 4)
      for (int64_t i = 0; i < x.n; ++i) {
        if (catcher.failed() || poller.should_stop()) continue;
        catcher.run([&] {
          Rng rng(stream_seed(spec_.seed, kPredictSalt, static_cast<uint64_t>(i)));
          const LayerInput in = forward_hidden(layers_, ws, kr, csr_row(x, i), use_lsh, 0.0f, rng, nullptr);
          select_output(out, ws, in, use_lsh, sel, n_prior ? prior->data() : nullptr, n_prior, all, rng);
          output_logits(out, ws, kr, in, use_lsh, all);
          const std::vector<float>& z = ws.out[nl - 1];
          const std::vector<int32_t>& A = ws.active[nl - 1];
          int32_t* lab = out_labels + i * k;
          float* sc = out_scores + i * k;
          std::fill(lab, lab + k, -1);
          std::fill(sc, sc + k, 0.0f);
          const size_t m = z.size();
          if (stats) stats[i] = SoftmaxStats{};
          if (m == 0) return;
          float mx = z[0];
          for (size_t j = 1; j < m; ++j) mx = std::max(mx, z[j]);
          double sum = 0.0;
          for (size_t j = 0; j < m; ++j) sum += std::exp(z[j] - mx);
          if (stats) stats[i] = SoftmaxStats{mx, sum};
          auto& heap = ws.heap;
          heap.clear();
          for (size_t j = 0; j < m; ++j) {
            heap_offer(heap, static_cast<size_t>(k), Scored(z[j], use_lsh ? A[j] : static_cast<int32_t>(j)));
          }
          std::sort_heap(heap.begin(), heap.end(), better);
          const float inv_sum = static_cast<float>(1.0 / sum);
          for (size_t j = 0; j < heap.size(); ++j) {
            lab[j] = heap[j].second;
            sc[j] = sigmoid ? sigmoid_score(heap[j].first) : std::exp(heap[j].first - mx) * inv_sum;
          }
        });
      }
    }
    catcher.rethrow();
    if (poller.stopped()) throw Interrupted();
  }
}

}  // namespace slide

namespace slide {

namespace {
// The inference index over the output layer's rows (float32, or bf16 widened while building).
std::shared_ptr<const LabelIndex> make_index(const Layer& out, int threads, uint64_t seed) {
  return std::make_shared<const LabelIndex>(out.bf16 ? nullptr : out.weight.data(),
                                            out.bf16 ? out.weight16.data() : nullptr, out.bias.data(), out.out_dim,
                                            out.row_len, LabelIndexParams(), threads, seed);
}
constexpr uint64_t kIndexSalt = 0x4C4E4458ull;
}  // namespace

IndexInfo Network::index_info() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  IndexInfo info;
  std::shared_ptr<const LabelIndex> ix = predict_cache_->current_index(step_);
  if (!ix) return info;
  info.built = true;
  info.clusters = ix->clusters();
  info.largest_cluster = ix->largest_cluster();
  info.default_probe = ix->default_probe();
  info.rows = ix->rows();
  info.bytes = ix->bytes();
  info.build_seconds = ix->build_seconds();
  return info;
}

IndexInfo Network::build_index() const {
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const Layer& out = layers_.back();
    if (out.sparse_input)
      throw InvalidArgument("index: the output layer reads the input features directly; an index needs a hidden layer "
                            "before the output layer");
    predict_cache_->index(step_, [&] { return make_index(out, threads_, stream_seed(spec_.seed, kIndexSalt)); });
  }
  return index_info();
}

void Network::predict_index(const CsrView& x, int k, int32_t* out_labels, float* out_scores, SoftmaxStats* stats,
                            const IndexQuery& query) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (k < 1) throw InvalidArgument("k: must be >= 1, got " + std::to_string(k));
  if (query.probe < 0) throw InvalidArgument("probe: must be >= 0 (0 = auto), got " + std::to_string(query.probe));
  const Layer& out = layers_.back();
  if (out.sparse_input)
    throw InvalidArgument("index: the output layer reads the input features directly; an index needs a hidden layer "
                          "before the output layer");
  const std::shared_ptr<const LabelIndex> ix =
      predict_cache_->index(step_, [&] { return make_index(out, threads_, stream_seed(spec_.seed, kIndexSalt)); });
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const int64_t len = out.row_len, C = ix->clusters();
  const int64_t probe = query.probe > 0 ? std::min(C, query.probe) : ix->default_probe();
  const float* W = out.weight.data();
  const float* bias = out.bias.data();
  const bool sigmoid = out.spec.activation == Activation::Sigmoid;
  // A block of samples shares one matrix product for its cluster scores, and each probed
  // cluster's rows are read once for all the samples of the block that probe it (frequent
  // labels sit in clusters that most queries probe). Each sample's labels are scored in its
  // own probe order with the same dot products as a single query, so a row predicted alone
  // or in a batch gets the same result. Blocks are cut so that their slots stay within
  // kSlotBudget labels (probing every cluster scores one sample at a time).
  constexpr int64_t kMaxBlock = 64, kSlotBudget = int64_t(1) << 21;
  const int64_t worst = std::max<int64_t>(1, probe * ix->largest_cluster());
  const int64_t block = std::max<int64_t>(1, std::min(kMaxBlock, kSlotBudget / worst));
  const int64_t blocks = (x.n + block - 1) / block;
  // One sample runs on the calling thread: waking a team costs more than the query.
  const int nt = x.n > 1 ? static_cast<int>(std::min<int64_t>(threads_, blocks)) : 1;
  struct Checkout {
    PredictCache& pool;
    std::vector<std::unique_ptr<SampleWorkspace>> wss;
    std::vector<std::unique_ptr<IndexScratch>> scratch;
    ~Checkout() {
      for (auto& ws : wss)
        if (ws) pool.give(std::move(ws));
      for (auto& s : scratch)
        if (s) pool.give_scratch(std::move(s));
    }
  } checkout{*predict_cache_, {}, {}};
  for (int t = 0; t < nt; ++t) {
    checkout.wss.push_back(predict_cache_->take(layers_));
    checkout.scratch.push_back(predict_cache_->take_scratch());
  }
  auto row_prefetch = [&](int64_t r) {
    if (out.bf16)
      prefetch_row(reinterpret_cast<const float*>(out.row16(r)), len / 2);
    else
      prefetch_row(W + r * len, len);
  };
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    SampleWorkspace& ws = *checkout.wss[omp_get_thread_num()];
    IndexScratch& sc = *checkout.scratch[omp_get_thread_num()];
    catcher.run([&] {
      sc.H.resize(static_cast<size_t>(block * len));
      sc.cluster_scores.resize(static_cast<size_t>(block * C));
      sc.probe.resize(static_cast<size_t>(block * probe));
      sc.offset.resize(static_cast<size_t>(block + 1));
      if (out.bf16) sc.wide.resize(static_cast<size_t>(len));
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        const int64_t s0 = blk * block, ns = std::min(block, x.n - s0);
        Rng unused(0);  // no sampling and no dropout here
        for (int64_t s = 0; s < ns; ++s) {
          forward_hidden(layers_, ws, kr, csr_row(x, s0 + s), false, 0.0f, unused, nullptr);
          std::copy(ws.out[nl - 2].begin(), ws.out[nl - 2].end(), sc.H.begin() + s * len);
        }
        ix->cluster_scores(kr, sc.H.data(), len, ns, sc.cluster_scores.data());
        // Each sample's slots: its probed clusters' members, in probe order.
        sc.visits.clear();  // (cluster << 32 | sample, first slot), sorted by cluster, then sample
        sc.offset[0] = 0;
        for (int64_t s = 0; s < ns; ++s) {
          int32_t* pr = sc.probe.data() + s * probe;
          ix->best_clusters(sc.cluster_scores.data() + s * C, probe, sc.order, pr);
          int64_t slot = sc.offset[s];
          for (int64_t p = 0; p < probe; ++p) {
            sc.visits.emplace_back(static_cast<int64_t>(pr[p]) << 32 | s, slot);
            slot += ix->cluster_size(pr[p]);
          }
          sc.offset[s + 1] = slot;
        }
        std::sort(sc.visits.begin(), sc.visits.end());
        const int64_t nv = static_cast<int64_t>(sc.visits.size());
        const int64_t slots = sc.offset[ns];
        sc.logits.resize(static_cast<size_t>(slots));
        sc.ids.resize(static_cast<size_t>(slots));
        constexpr int64_t kAhead = 6;  // rows are scattered: prefetch well ahead
        for (int64_t j = 0; j < nv;) {
          const int64_t c = sc.visits[j].first >> 32;
          int64_t e = j;
          while (e < nv && (sc.visits[e].first >> 32) == c) ++e;
          const int32_t* m = ix->members_begin(c);
          const int64_t cnt = ix->cluster_size(c);
          // The next cluster's first rows are prefetched while this one ends.
          const int32_t* next = e < nv ? ix->members_begin(sc.visits[e].first >> 32) : nullptr;
          const int64_t next_cnt = e < nv ? ix->cluster_size(sc.visits[e].first >> 32) : 0;
          for (int64_t q = 0; q < std::min(kAhead, cnt) && j == 0; ++q) row_prefetch(m[q]);
          for (int64_t q = 0; q < cnt; ++q) {
            if (q + kAhead < cnt)
              row_prefetch(m[q + kAhead]);
            else if (q + kAhead - cnt < next_cnt)
              row_prefetch(next[q + kAhead - cnt]);
            const int64_t r = m[q];
            const float* w = W + r * len;
            if (out.bf16) {
              kr.from_bf16(out.row16(r), sc.wide.data(), len);
              w = sc.wide.data();
            }
            for (int64_t v = j; v < e; ++v) {
              const int64_t s = sc.visits[v].first & 0xFFFFFFFF;
              const int64_t slot = sc.visits[v].second + q;
              sc.logits[slot] = kr.dot(w, sc.H.data() + s * len, len) + bias[r];
              sc.ids[slot] = static_cast<int32_t>(r);
            }
          }
          j = e;
        }
        for (int64_t s = 0; s < ns; ++s) {
          const int64_t i = s0 + s;
          int32_t* lab = out_labels + i * k;
          float* scr = out_scores + i * k;
          std::fill(lab, lab + k, -1);
          std::fill(scr, scr + k, 0.0f);
          if (stats) stats[i] = SoftmaxStats{};
          const float* z = sc.logits.data() + sc.offset[s];
          const int32_t* id = sc.ids.data() + sc.offset[s];
          const int64_t m = sc.offset[s + 1] - sc.offset[s];
          if (m == 0) continue;
          float mx = z[0];
          for (int64_t j = 1; j < m; ++j) mx = std::max(mx, z[j]);
          const double sum = kr.exp_sum(z, m, mx);
          if (stats) stats[i] = SoftmaxStats{mx, sum};
          auto& heap = ws.heap;
          heap.clear();
          for (int64_t j = 0; j < m; ++j)
            if (heap.size() < static_cast<size_t>(k) || z[j] >= heap.front().first)
              heap_offer(heap, static_cast<size_t>(k), Scored(z[j], id[j]));
          std::sort_heap(heap.begin(), heap.end(), better);
          for (size_t j = 0; j < heap.size(); ++j) {
            lab[j] = heap[j].second;
            scr[j] = sigmoid ? sigmoid_score(heap[j].first)
                             : static_cast<float>(std::exp(static_cast<double>(heap[j].first) - mx) / sum);
          }
        }
      });
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
  if (shard_begin_ != 0)
    for (int64_t i = 0; i < x.n * k; ++i)
      if (out_labels[i] >= 0) out_labels[i] += static_cast<int32_t>(shard_begin_);
}

}  // namespace slide

namespace slide {

bool Network::all_logits(const CsrView& x, float* out_z) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!batch_ || layers_.back().out_dim > kMaxRecordedWidth || sharded()) return false;
  std::vector<int32_t> labels(static_cast<size_t>(x.n));  // the top-1 that path also gives
  std::vector<float> scores(static_cast<size_t>(x.n));
  predict_layerwise(x, 1, labels.data(), scores.data(), nullptr, out_z);
  return true;
}

void Network::label_logits(const CsrView& x, const int64_t* cand_indptr, const int32_t* cand, float* out_z) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const Layer& out = layers_.back();
  const int64_t N = out.out_dim;
  if (cand_indptr[0] != 0) throw InvalidArgument("cand_indptr: must start at 0");
  for (int64_t i = 0; i < x.n; ++i)
    if (cand_indptr[i + 1] < cand_indptr[i])
      throw InvalidArgument("cand_indptr: must not decrease (row " + std::to_string(i) + ")");
  for (int64_t j = 0; j < cand_indptr[x.n]; ++j)
    if (cand[j] < 0 || cand[j] >= N)
      throw InvalidArgument("cand: label " + std::to_string(cand[j]) + " is outside [0, " + std::to_string(N) + ")");
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const int64_t len = out.row_len;
  const int nt = x.n > 1 && x.n * sample_work_ > kParallelWork ? static_cast<int>(std::min<int64_t>(threads_, x.n)) : 1;
  WorkspaceCheckout checkout(*predict_cache_, layers_, nt);
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    SampleWorkspace& ws = *checkout.wss[omp_get_thread_num()];
    std::vector<float> wide(out.bf16 ? static_cast<size_t>(len) : 0);
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < x.n; ++i) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        const int64_t c0 = cand_indptr[i], c1 = cand_indptr[i + 1];
        if (out.sparse_input) {
          // The output layer reads the input: its weight rows are per feature.
          const SparseRow r = csr_row(x, i);
          for (int64_t j = c0; j < c1; ++j) {
            const int64_t label = cand[j];
            float z = out.bias[label];
            for (int64_t q = 0; q < r.nnz; ++q) {
              const int64_t at = static_cast<int64_t>(r.indices[q]) * len + label;
              z += r.values[q] * (out.bf16 ? bf16_to_float(out.weight16[at]) : out.weight[at]);
            }
            out_z[j] = z;
          }
          return;
        }
        Rng unused(0);  // no sampling and no dropout here
        forward_hidden(layers_, ws, kr, csr_row(x, i), false, 0.0f, unused, nullptr);
        const float* h = ws.out[nl - 2].data();
        for (int64_t j = c0; j < c1; ++j) {
          const int64_t label = cand[j];
          const float* w = out.weight.data() + label * len;
          if (out.bf16) {
            kr.from_bf16(out.row16(label), wide.data(), len);
            w = wide.data();
          }
          out_z[j] = kr.dot(w, h, len) + out.bias[label];
        }
      });
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
}

}  // namespace slide
