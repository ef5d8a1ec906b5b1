// XC text writer, CSR validation and content fingerprints (see data.hpp).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "slide/common.hpp"
#include "slide/data.hpp"
#include "slide/random.hpp"

namespace slide {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

template <class T>
void append_number(std::string& s, T v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form for float
  s.append(buf, r.ptr);
}

// Formats rows [r0, r1) of the dataset as XC data lines.
void format_rows(std::string& s, int64_t r0, int64_t r1, const CsrView& f, const CsrView& l) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t lb = l.indptr[r];
    const int64_t le = l.indptr[r + 1];
    for (int64_t j = lb; j < le; ++j) {
      if (j > lb) s += ',';
      append_number(s, l.indices[j]);
    }
    const int64_t fb = f.indptr[r];
    const int64_t fe = f.indptr[r + 1];
    if (lb == le && fb == fe) s += ' ';  // a point with neither labels nor features
    for (int64_t j = fb; j < fe; ++j) {
      const float v = f.values[j];
      if (!std::isfinite(v)) {
        throw InvalidArgument("row " + std::to_string(r) + ": feature " + std::to_string(f.indices[j]) +
                              " has a NaN or infinite value");
      }
      s += ' ';
      append_number(s, f.indices[j]);
      s += ':';
      append_number(s, v);
    }
    s += '\n';
  }
}

}  // namespace

void write_xc(const std::string& path, int64_t num_points, int64_t num_features, int64_t num_labels,
              CsrView features, CsrView labels, int num_threads) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) {
    int err = errno;
    throw FileNotFound("cannot open " + path + " for writing: " + std::strerror(err));
  }
  auto write = [&](const std::string& s) {
    if (!s.empty() && std::fwrite(s.data(), 1, s.size(), file.get()) != s.size()) {
      int err = errno;
      throw Error("cannot write " + path + ": " + std::strerror(err));
    }
  };
  write(std::to_string(num_points) + " " + std::to_string(num_features) + " " + std::to_string(num_labels) + "\n");

  // Blocks of rows are formatted in parallel and written in order, a bounded
  // number at a time so memory does not grow with the dataset.
  const int threads = resolve_threads(num_threads);
  constexpr int64_t kBlockRows = 4096;
  const int64_t blocks = (num_points + kBlockRows - 1) / kBlockRows;
  const int64_t per_round = static_cast<int64_t>(threads) * 4;
  std::vector<std::string> text(static_cast<size_t>(per_round));
  for (int64_t first = 0; first < blocks; first += per_round) {
    const int64_t count = std::min(per_round, blocks - first);
    ExceptionCatcher catcher;
#pragma omp parallel for num_threads(static_cast<int>(std::min<int64_t>(threads, count))) schedule(dynamic, 1)
    for (int64_t b = 0; b < count; ++b) {
      catcher.run([&] {
        std::string& s = text[static_cast<size_t>(b)];
        s.clear();
        const int64_t r0 = (first + b) * kBlockRows;
        format_rows(s, r0, std::min(num_points, r0 + kBlockRows), features, labels);
      });
    }
    catcher.rethrow();
    if (interrupt_requested()) throw Interrupted();
    for (int64_t b = 0; b < count; ++b) write(text[static_cast<size_t>(b)]);
  }
  if (std::fflush(file.get()) != 0) {
    int err = errno;
    throw Error("cannot write " + path + ": " + std::strerror(err));
  }
  std::FILE* f = file.release();
  if (std::fclose(f) != 0) {
    int err = errno;
    throw Error("cannot write " + path + ": " + std::strerror(err));
  }
}

CsrCheck check_csr(int64_t rows, const int64_t* indptr, int64_t nnz, const int32_t* indices,
                   int64_t num_columns, const float* values, int num_threads) {
  CsrCheck result;
  if (rows < 0 || nnz < 0) {
    result.problem = "negative size";
    return result;
  }
  if (indptr[0] != 0) {
    result.problem = "indptr[0] is " + std::to_string(indptr[0]) + ", expected 0";
    return result;
  }
  if (indptr[rows] != nnz) {
    result.problem = "indptr[" + std::to_string(rows) + "] is " + std::to_string(indptr[rows]) +
                     " but there are " + std::to_string(nnz) + " indices";
    return result;
  }
  // Pointers first (so the index loop below cannot read out of bounds), then
  // indices and values; each block records its first problem, the lowest wins.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  const int threads = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), std::max<int64_t>(blocks, 1)));
  std::vector<int64_t> bad_ptr(static_cast<size_t>(blocks), -1);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r1 = std::min(rows, (b + 1) * kBlock);
    for (int64_t r = b * kBlock; r < r1; ++r) {
      if (indptr[r + 1] < indptr[r] || indptr[r + 1] > nnz) {
        bad_ptr[static_cast<size_t>(b)] = r;
        break;
      }
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r = bad_ptr[static_cast<size_t>(b)];
    if (r >= 0) {
      result.problem = "indptr is not non-decreasing within [0, nnz] at row " + std::to_string(r);
      return result;
    }
  }
  std::vector<std::string> problems(static_cast<size_t>(blocks));
  std::vector<char> unsorted(static_cast<size_t>(blocks), 0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r1 = std::min(rows, (b + 1) * kBlock);
    std::string& problem = problems[static_cast<size_t>(b)];
    for (int64_t r = b * kBlock; r < r1 && problem.empty(); ++r) {
      for (int64_t j = indptr[r]; j < indptr[r + 1]; ++j) {
        const int32_t c = indices[j];
        if (c < 0 || c >= num_columns) {
          problem = "row " + std::to_string(r) + ": column index " + std::to_string(c) + " is outside [0, " +
                    std::to_string(num_columns) + ")";
          break;
        }
        if (j > indptr[r] && c <= indices[j - 1]) unsorted[static_cast<size_t>(b)] = 1;
        if (values != nullptr && !std::isfinite(values[j])) {
          problem = "row " + std::to_string(r) + ": column " + std::to_string(c) + " has a NaN or infinite value";
          break;
        }
      }
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (!problems[static_cast<size_t>(b)].empty()) {
      result.problem = problems[static_cast<size_t>(b)];
      return result;
    }
    if (unsorted[static_cast<size_t>(b)]) result.sorted_unique = false;
  }
  return result;
}

uint64_t fingerprint(const void* data, size_t bytes, int num_threads) {
  // Blocks are hashed independently (four multiply-xor lanes each, so the
  // loop is not bound by one dependency chain) and combined in order.
  const unsigned char* p = static_cast<const unsigned char*>(data);
  constexpr size_t kBlock = size_t{1} << 20;
  const int64_t blocks = static_cast<int64_t>((bytes + kBlock - 1) / kBlock);
  std::vector<uint64_t> block_hash(static_cast<size_t>(blocks));
  const int threads = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), std::max<int64_t>(blocks, 1)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kBlock;
    const size_t end = std::min(bytes, begin + kBlock);
    uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
    size_t i = begin;
    for (; i + 32 <= end; i += 32) {
      for (int k = 0; k < 4; ++k) {
        uint64_t w;
        std::memcpy(&w, p + i + 8 * k, 8);
        lane[k] = (lane[k] ^ w) * 0x9E3779B97F4A7C15ull;
        lane[k] ^= lane[k] >> 29;
      }
    }
    uint64_t tail = 0;
    for (; i < end; ++i) tail = (tail << 8 | p[i]) * 0x100000001B3ull;
    block_hash[static_cast<size_t>(b)] =
        mix64(lane[0] ^ mix64(lane[1] ^ mix64(lane[2] ^ mix64(lane[3] ^ tail ^ (end - begin)))));
  }
  uint64_t h = mix64(bytes);
  for (uint64_t bh : block_hash) h = mix64(h ^ bh);
  return h;
}

}  // namespace slide
