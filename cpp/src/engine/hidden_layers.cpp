// Phases 1 and 6b of a sample's step: forward and backward through the hidden layers
// (see slide/sample_step.hpp).
#include <algorithm>

#include "engine_internal.hpp"
#include "slide/sample_step.hpp"

namespace slide {

LayerInput forward_hidden(const std::vector<Layer>& layers, SampleWorkspace& ws, const Kernels& kr,
                          const SparseRow& x, bool use_lsh, float dropout, Rng& rng, const Rng* shared_fill) {
  const int nl = static_cast<int>(layers.size());
  PhaseTimer timer(ws.prof, Phase::Forward);
  for (int l = 0; l + 1 < nl; ++l) {
    const Layer& L = layers[l];
    std::vector<float>& z = ws.out[l];
    if (ws.prof)
      timer.add_bytes(L.sparse_input ? static_cast<double>(x.nnz) * static_cast<double>(L.row_len) * 4.0
                                     : static_cast<double>(L.out_dim) * static_cast<double>(L.row_len) * 4.0);
    if (L.sparse_input) {
      z.assign(L.bias.data(), L.bias.data() + L.out_dim);
      for (int64_t k = 0; k < x.nnz; ++k)
        kr.axpy(x.values[k], L.weight.data() + static_cast<int64_t>(x.indices[k]) * L.row_len, z.data(), L.out_dim);
    } else {
      const float* h = ws.out[l - 1].data();
      const float* W = L.weight.data();
      const float* b = L.bias.data();
      if (L.lsh() && use_lsh) {
        L.hash->hash_dense(h, ws.buckets.data());
        // Training draws the random part of the active set from a stream shared by the whole
        // batch (each sample starts from the same state), as the output layer does.
        Rng fill = shared_fill ? *shared_fill : Rng(0);
        ws.samplers[l]->select(*L.tables, ws.buckets.data(), nullptr, 0, L.spec.selection, shared_fill ? fill : rng,
                               ws.active[l]);
        // Active rows are scattered over a large matrix: prefetch a few neurons ahead.
        const std::vector<int32_t>& A = ws.active[l];
        const size_t na = A.size();
        z.assign(L.out_dim, 0.0f);
        for (size_t i = 0; i < na; ++i) {
          if (i + kPrefetch < na) {
            prefetch_row(W + static_cast<int64_t>(A[i + kPrefetch]) * L.row_len, L.row_len);
            __builtin_prefetch(b + A[i + kPrefetch], 0, 3);
          }
          z[static_cast<size_t>(A[i])] = kr.dot(W + static_cast<int64_t>(A[i]) * L.row_len, h, L.row_len) + b[A[i]];
        }
      } else {
        z.resize(L.out_dim);
        for (int64_t i = 0; i < L.out_dim; ++i) z[i] = kr.dot(W + i * L.row_len, h, L.row_len) + b[i];
      }
    }
    if (dropout > 0.0f) ws.mask[l].resize(z.size());
    activate(L.spec.activation, z.data(), ws.mask[l].data(), static_cast<int64_t>(z.size()), dropout, rng);
  }
  LayerInput in;
  if (nl > 1) in.dense = ws.out[nl - 2].data();
  else in.sparse = x;
  return in;
}

void backward_hidden(std::vector<Layer>& layers, SampleWorkspace& ws, SampleRecord& rec, const Kernels& kr,
                     const SparseRow& x, float dropout) {
  const int nl = static_cast<int>(layers.size());
  PhaseTimer timer(ws.prof, Phase::Backward);
  for (int l = nl - 2; l >= 0; --l) {
    Layer& L = layers[l];
    std::vector<float>& dl = ws.delta[l];
    // Through this layer's dropout and activation.
    backprop_activation(L.spec.activation, ws.out[l].data(), dropout > 0.0f ? ws.mask[l].data() : nullptr,
                        dl.data(), L.out_dim);
    float* Wg = L.weight_grad.data();
    float* bg = L.bias_grad.data();
    if (L.sparse_input) {
      if (L.records) {
        rec.rows[l].assign(x.indices, x.indices + x.nnz);
        rec.coef[l].assign(x.values, x.values + x.nnz);
        rec.vec[l].assign(dl.begin(), dl.begin() + L.out_dim);
      } else {
        for (int64_t k = 0; k < x.nnz; ++k) {
          kr.axpy(x.values[k], dl.data(), Wg + static_cast<int64_t>(x.indices[k]) * L.row_len, L.row_len);
          mark_row(L, x.indices[k], ws.touched[l]);
        }
        for (int64_t j = 0; j < L.out_dim; ++j) bg[j] += dl[j];
      }
      continue;
    }
    const float* h = ws.out[l - 1].data();
    const float* W = L.weight.data();
    std::vector<float>& dh = ws.delta[l - 1];
    dh.assign(L.in_dim, 0.0f);
    if (L.records) {
      // Only dL/dh needs the weights now; the row gradients are formed by the optimizer.
      std::vector<int32_t>& rr = rec.rows[l];
      std::vector<float>& rc = rec.coef[l];
      rec.vec[l].assign(h, h + L.in_dim);
      if (L.lsh()) {
        const std::vector<int32_t>& act = ws.active[l];
        const size_t na = act.size();
        for (size_t i = 0; i < na; ++i) {
          if (i + kPrefetch < na) prefetch_row(W + static_cast<int64_t>(act[i + kPrefetch]) * L.row_len, L.row_len);
          const int32_t n = act[i];
          const float dn = dl[n];
          if (dn == 0.0f) continue;
          rr.push_back(n);
          rc.push_back(dn);
          kr.axpy(dn, W + static_cast<int64_t>(n) * L.row_len, dh.data(), L.row_len);
        }
      } else {
        for (int64_t n = 0; n < L.out_dim; ++n) {
          const float dn = dl[n];
          if (dn == 0.0f) continue;
          rr.push_back(static_cast<int32_t>(n));
          rc.push_back(dn);
          kr.axpy(dn, W + n * L.row_len, dh.data(), L.row_len);
        }
      }
    } else {
      for (int64_t i = 0; i < L.out_dim; ++i) {
        const float dn = dl[i];
        if (dn == 0.0f) continue;
        kr.backprop_row(dn, h, W + i * L.row_len, Wg + i * L.row_len, dh.data(), L.row_len);
        bg[i] += dn;
      }
    }
  }
}

}  // namespace slide
