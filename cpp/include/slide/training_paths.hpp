// The constants that choose how a network trains and predicts, and with that choice the
// determinism it guarantees. They are fixed (not configuration): a user never has to set
// them, but a result or a test that depends on the path should name the constant here.
#pragma once

#include <cstdint>

namespace slide {

// Gradient path of a layer. A layer whose neurons are hash-sampled, or whose width
// (neurons) is at most kMaxRecordedWidth, keeps per-sample gradient records: memory
// O(batch x active) per layer, each row's gradient summed in batch order by the optimizer,
// so its results are bit-identical for any number of threads. A wider dense layer adds
// into shared gradient buffers without locks (HOGWILD): bit-identical with one thread only.
// Prediction also uses it: a dense output layer at most this wide is scored layer by layer
// (see kMaxBatchFloats), a wider one by the blocked exact scorer.
constexpr int64_t kMaxRecordedWidth = 4096;

// Batched dense path. A network without hash-sampled layers whose first layer keeps records
// trains a batch layer by layer (matrix products over the whole batch) while the batch's
// activations, 3 x batch x (neurons over all layers) floats (with training.recompute: the
// checkpoints, two scratch and two delta matrices), stay within kMaxBatchFloats (256 MiB);
// otherwise it trains sample by sample. Both paths are deterministic for a seed
// but give different bits, so the batch size can change which bits a run produces.
constexpr int64_t kMaxBatchFloats = int64_t(1) << 26;

// In-batch negatives. A hash-sampled output layer with min_active > 0 that has more than
// kInBatchWidth neurons per slot of its widest active set (max(min_active, max_active))
// adds the batch's labels to every sample's active set as negatives (logQ-weighted when
// label frequencies are known); a narrower layer does not. Results depend on the batch
// composition either way, never on the thread count.
constexpr int64_t kInBatchWidth = 2;

// Shared in-batch negatives (Network::set_shared_negatives, auto): a hash-sampled output layer
// of at least this many neurons that takes in-batch negatives (kInBatchWidth) and reads a hidden
// layer scores the negatives its samples share, the batch's labels and one uniform fill of
// min_active neurons, as one block per batch (trainer_shared.cpp); each sample still scores its
// own labels and hash candidates among scattered rows. Narrower layers train per sample as before.
constexpr int64_t kSharedNegativesWidth = 65536;

// Spread table rebuilds (Network::set_rebuild_spread, auto): an LSH layer of at least this many
// rows (neurons) rebuilds its tables over min(kMaxRebuildSpread, rebuild_first / 2) batches
// instead of stalling one batch for the whole rebuild; a smaller layer rebuilds at once.
// Measured on the amazon-670k shape (670,091 rows of 128, DWTA K=8 L=50, 2 threads): an
// at-once rebuild stalled its batch for seconds.
constexpr int64_t kSpreadRebuildRows = int64_t(1) << 17;
constexpr int64_t kMaxRebuildSpread = 64;

}  // namespace slide
