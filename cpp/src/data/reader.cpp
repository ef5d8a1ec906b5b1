// Parallel readers for the XC and libsvm multilabel text formats (see data.hpp).
//
// The file is cut into chunks at line boundaries; each thread reads whole
// chunks with pread() into a buffer of its own and parses them into scratch
// arrays, then every chunk is copied into the exact-size result and its scratch
// freed. Scratch arrays are anonymous mappings sized by a provable upper bound
// (so they never reallocate) and are unmapped as soon as they are copied; a
// chunk's text lives only while it is parsed: peak memory stays close to the
// result.
//
// The file is read, never memory-mapped: touching a mapped page past the end of
// a file that another process truncated meanwhile raises SIGBUS, which kills
// the process. A short read instead becomes a DataError naming the file, and
// the file's size and mtime are compared before and after reading.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "slide/common.hpp"
#include "slide/data.hpp"

namespace slide {

DataFormat parse_format_name(const std::string& name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "xc") return DataFormat::kXC;
  if (name == "libsvm") return DataFormat::kLibSVM;
  throw InvalidArgument("format must be 'auto', 'xc' or 'libsvm', got '" + name + "'");
}

const char* format_name(DataFormat format) noexcept {
  switch (format) {
    case DataFormat::kXC: return "xc";
    case DataFormat::kLibSVM: return "libsvm";
    default: return "auto";
  }
}

namespace {

// Largest width of a feature or label space: ids are stored as int32.
constexpr int64_t kMaxWidth = INT32_MAX;

// Fixed-capacity array in its own anonymous mapping. Capacity is reserved
// address space only; pages are committed as they are written and returned to
// the system by the destructor (unlike heap memory, which malloc may keep).
template <class T>
class MappedArray {
 public:
  MappedArray() = default;
  explicit MappedArray(size_t capacity) : capacity_(capacity) {
    if (capacity_ == 0) return;
    void* p = mmap(nullptr, capacity_ * sizeof(T), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Small pages: a huge page would commit 2 MiB for each partly used array.
    madvise(p, capacity_ * sizeof(T), MADV_NOHUGEPAGE);
    data_ = static_cast<T*>(p);
  }
  MappedArray(const MappedArray&) = delete;
  MappedArray& operator=(const MappedArray&) = delete;
  MappedArray(MappedArray&& o) noexcept { swap(o); }
  MappedArray& operator=(MappedArray&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~MappedArray() { release(); }

  void release() noexcept {
    if (data_ != nullptr) munmap(data_, capacity_ * sizeof(T));
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  // The caller guarantees size() < capacity (capacities are upper bounds).
  void push_back(T v) noexcept { data_[size_++] = v; }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  T& operator[](size_t i) noexcept { return data_[i]; }
  T back() const noexcept { return data_[size_ - 1]; }

 private:
  void swap(MappedArray& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// The text to parse: a file read with pread() (several threads may read at
// once) or bytes already in memory. read() returns a pointer to [offset,
// offset + len): into the memory itself, or into `buf`, filled from the file.
class TextSource {
 public:
  TextSource(const char* data, size_t size, std::string name) : memory_(data), size_(size), name_(std::move(name)) {}

  static TextSource open_file(const std::string& path) {
    TextSource src(nullptr, 0, path);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      throw FileNotFound(path + ": " + std::strerror(err));
    }
    src.fd_ = fd;  // closed by the destructor from here on
    if (fstat(fd, &src.st_) != 0) {
      int err = errno;
      throw FileNotFound(path + ": " + std::strerror(err));
    }
    if (S_ISDIR(src.st_.st_mode)) throw InvalidArgument(path + ": is a directory, not a dataset file");
    if (!S_ISREG(src.st_.st_mode)) throw InvalidArgument(path + ": not a regular file");
    src.size_ = static_cast<size_t>(src.st_.st_size);
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    return src;
  }
  TextSource(const TextSource&) = delete;
  TextSource& operator=(const TextSource&) = delete;
  TextSource(TextSource&& o) noexcept
      : memory_(o.memory_), size_(o.size_), name_(std::move(o.name_)), fd_(o.fd_), st_(o.st_) {
    o.fd_ = -1;
  }
  TextSource& operator=(TextSource&&) = delete;
  ~TextSource() {
    if (fd_ >= 0) ::close(fd_);
  }

  size_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

  const char* read(size_t offset, size_t len, std::vector<char>& buf) const {
    if (fd_ < 0) return memory_ + offset;
    buf.resize(len);
    size_t done = 0;
    while (done < len) {
      const ssize_t r = ::pread(fd_, buf.data() + done, len - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        throw DataError(name_ + ": cannot read the file: " + std::strerror(err));
      }
      if (r == 0) throw changed("a read found no data at byte " + std::to_string(offset + done));
      done += static_cast<size_t>(r);
    }
    return buf.data();
  }

  // Throws when the file's size or modification time differs from when it was
  // opened: the parts read may then come from different versions of it.
  void check_unchanged() const {
    if (fd_ < 0) return;
    struct stat now {};
    if (fstat(fd_, &now) != 0) {
      int err = errno;
      throw DataError(name_ + ": cannot read the file: " + std::strerror(err));
    }
    if (now.st_size != st_.st_size || now.st_mtim.tv_sec != st_.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != st_.st_mtim.tv_nsec) {
      throw changed("it was modified");
    }
  }

 private:
  DataError changed(const std::string& what) const {
    struct stat now {};
    std::string size_now;
    if (fstat(fd_, &now) == 0) size_now = ", now " + std::to_string(now.st_size);
    return DataError(name_ + ": the file changed while it was being read (" + what + "; " +
                     std::to_string(size_) + " bytes when opened" + size_now + "); read it again once it is complete");
  }

  const char* memory_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  int fd_ = -1;
  struct stat st_ {};
};

inline bool is_blank(char c) noexcept { return c == ' ' || c == '\t'; }

// Quoted, printable excerpt of a token for error messages (binary input stays readable).
std::string excerpt(const char* b, const char* e) {
  size_t n = static_cast<size_t>(e - b);
  const bool cut = n > 40;
  if (cut) n = 40;
  std::string s = "'";
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(b[i]);
    if (c >= 0x20 && c < 0x7f) {
      s += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    }
  }
  if (cut) s += "...";
  s += "'";
  return s;
}

enum class IdStatus { kOk, kNotNumber, kNegative, kTooLarge };

// Decimal id in [b, e). Saturates instead of overflowing so huge ids are
// reported as too large rather than wrapping around.
IdStatus parse_id(const char* b, const char* e, int64_t& out) noexcept {
  if (b == e) return IdStatus::kNotNumber;
  bool negative = false;
  if (*b == '-') {
    negative = true;
    if (++b == e) return IdStatus::kNotNumber;
  }
  uint64_t v = 0;
  bool huge = false;
  for (; b < e; ++b) {
    unsigned d = static_cast<unsigned char>(*b) - static_cast<unsigned>('0');
    if (d > 9) return IdStatus::kNotNumber;
    if (v < (uint64_t{1} << 40)) {
      v = v * 10 + d;
    } else {
      huge = true;
    }
  }
  if (negative && (v != 0 || huge)) return IdStatus::kNegative;
  if (huge) return IdStatus::kTooLarge;
  out = static_cast<int64_t>(v);
  return IdStatus::kOk;
}

struct LineProblem {
  std::string what;
};

// Plain decimals "[-]digits[.digits]" with fewer than 2^24 as significand and
// at most 10 fractional digits: significand and 10^k are both exact floats, so
// one IEEE division gives the correctly rounded float32 (Clinger, "How to read
// floating point numbers accurately", PLDI 1990). Returns false otherwise.
bool parse_simple_decimal(const char* b, const char* e, float& out) noexcept {
  static constexpr float kPow10[] = {1e0f, 1e1f, 1e2f, 1e3f, 1e4f, 1e5f, 1e6f, 1e7f, 1e8f, 1e9f, 1e10f};
  const bool negative = *b == '-';
  if (negative) ++b;
  uint32_t m = 0;
  int digits = 0;
  int fraction = -1;  // digits after '.', -1 while none seen
  for (; b < e; ++b) {
    const unsigned d = static_cast<unsigned char>(*b) - static_cast<unsigned>('0');
    if (d <= 9) {
      if (m >= (1u << 24) / 10 + 1) return false;  // significand would reach 2^24
      m = m * 10 + d;
      ++digits;
      if (fraction >= 0) ++fraction;
    } else if (*b == '.' && fraction < 0) {
      fraction = 0;
    } else {
      return false;
    }
  }
  if (digits == 0 || fraction > 10 || m > (1u << 24)) return false;
  float v = static_cast<float>(m);
  if (fraction > 0) v /= kPow10[fraction];
  out = negative ? -v : v;
  return true;
}

// Value of a feature in [b, e), non-empty.
float parse_value(const char* b, const char* e) {
  if (e - b == 1 && *b == '1') return 1.0f;  // binary data: the common case
  {
    float v;
    if (parse_simple_decimal(b, e, v)) return v;
  }
  const char* s = b;
  if (*s == '+') ++s;
  float v = 0.0f;
  auto r = std::from_chars(s, e, v);
  if (r.ptr != e || r.ec == std::errc::invalid_argument || s == e) {
    throw LineProblem{"value " + excerpt(b, e) + " is not a number"};
  }
  if (r.ec == std::errc::result_out_of_range) {
    // Underflow reads as the nearest float32 (zero or subnormal); overflow is an error.
    double d = 0.0;
    auto rd = std::from_chars(s, e, d);
    if (rd.ec == std::errc() && std::fabs(d) < 1.0) {
      v = static_cast<float>(d);
    } else {
      throw LineProblem{"value " + excerpt(b, e) + " is outside the float32 range"};
    }
  }
  if (!std::isfinite(v)) throw LineProblem{"value " + excerpt(b, e) + " is NaN or infinite"};
  return v;
}

struct Setup {
  bool libsvm = false;
  int64_t feature_limit = kMaxWidth;  // 0-based ids must be below this
  int64_t label_limit = kMaxWidth;
  bool features_given = false;  // limit came from the header or the caller
  bool labels_given = false;
};

struct Chunk {
  size_t offset = 0;  // the chunk's bytes in the source
  size_t length = 0;
  MappedArray<int64_t> feature_ptr;  // local offsets, rows + 1
  MappedArray<int32_t> feature_ids;
  MappedArray<float> feature_values;
  MappedArray<int64_t> label_ptr;
  MappedArray<int32_t> label_ids;
  int64_t rows = 0;
  int64_t last_nonblank = -1;  // local row index
  int64_t max_feature = -1;
  int64_t max_label = -1;
  bool complete = false;  // every line parsed (rows counts them all)
  bool failed = false;
  int64_t error_line = 0;  // 1-based, local to the chunk
  std::string error;
};

std::string id_text(const char* b, const char* e) { return std::string(b, static_cast<size_t>(e - b)); }

// Sorts one row's (id, value) pairs and rejects duplicates. `shift` turns the
// stored id back into the id written in the file for the message.
void sort_row(int32_t* ids, float* values, size_t n, std::vector<std::pair<int32_t, float>>& scratch,
              const char* what, int64_t shift) {
  scratch.clear();
  for (size_t i = 0; i < n; ++i) scratch.emplace_back(ids[i], values ? values[i] : 0.0f);
  std::sort(scratch.begin(), scratch.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && scratch[i].first == scratch[i - 1].first) {
      throw LineProblem{std::string("duplicate ") + what + " id " +
                        std::to_string(scratch[i].first + shift) + " on this line"};
    }
    ids[i] = scratch[i].first;
    if (values) values[i] = scratch[i].second;
  }
}

// Parses one line [p, e) (line end, CR and trailing blanks already stripped).
void parse_line(const char* p, const char* e, const Setup& s, Chunk& c,
                std::vector<std::pair<int32_t, float>>& scratch) {
  // Labels: the first token, unless the line starts with a blank (no labels)
  // or the first token is already a feature.
  if (p < e && !is_blank(*p)) {
    const char* t = p;
    while (t < e && !is_blank(*t)) ++t;
    if (std::memchr(p, ':', static_cast<size_t>(t - p)) == nullptr) {
      const size_t first = c.label_ids.size();
      int64_t prev = -1;
      bool sorted = true;
      const char* q = p;
      while (true) {
        const char* comma = static_cast<const char*>(std::memchr(q, ',', static_cast<size_t>(t - q)));
        const char* qe = comma ? comma : t;
        int64_t id = 0;
        switch (parse_id(q, qe, id)) {
          case IdStatus::kOk: break;
          case IdStatus::kNotNumber:
            if (q == qe) throw LineProblem{"empty label id in " + excerpt(p, t)};
            throw LineProblem{"label id " + excerpt(q, qe) + " is not a number"};
          case IdStatus::kNegative: throw LineProblem{"negative label id " + id_text(q, qe)};
          case IdStatus::kTooLarge: id = INT64_MAX; break;
        }
        if (id >= s.label_limit) {
          if (s.labels_given) {
            throw LineProblem{"label id " + id_text(q, qe) + " >= num_labels " + std::to_string(s.label_limit)};
          }
          throw LineProblem{"label id " + id_text(q, qe) + " is too large (at most " +
                            std::to_string(kMaxWidth - 1) + ")"};
        }
        if (id <= prev) {
          if (id == prev) throw LineProblem{"duplicate label id " + std::to_string(id) + " on this line"};
          sorted = false;
        }
        prev = id;
        c.label_ids.push_back(static_cast<int32_t>(id));
        if (!comma) break;
        q = comma + 1;
      }
      const size_t n = c.label_ids.size() - first;
      if (!sorted) sort_row(c.label_ids.data() + first, nullptr, n, scratch, "label", 0);
      c.max_label = std::max<int64_t>(c.max_label, c.label_ids.back());
      p = t;
    }
  }
  // Features: "id:value" tokens separated by blanks.
  const size_t first = c.feature_ids.size();
  const int64_t shift = s.libsvm ? 1 : 0;
  int64_t prev = -1;
  bool sorted = true;
  while (true) {
    while (p < e && is_blank(*p)) ++p;
    if (p == e) break;
    const char* t = p;
    while (p < e && !is_blank(*p)) ++p;
    const char* colon = static_cast<const char*>(std::memchr(t, ':', static_cast<size_t>(p - t)));
    if (colon == nullptr) throw LineProblem{"feature " + excerpt(t, p) + " is not of the form id:value"};
    int64_t id = 0;
    switch (parse_id(t, colon, id)) {
      case IdStatus::kOk: break;
      case IdStatus::kNotNumber: throw LineProblem{"feature id " + excerpt(t, colon) + " is not a number"};
      case IdStatus::kNegative: throw LineProblem{"negative feature id " + id_text(t, colon)};
      case IdStatus::kTooLarge: id = INT64_MAX; break;
    }
    if (s.libsvm) {
      if (id == 0) throw LineProblem{"feature id 0 in libsvm format (feature ids are 1-based)"};
      if (id != INT64_MAX) id -= 1;
    }
    if (id >= s.feature_limit) {
      if (s.features_given) {
        throw LineProblem{"feature id " + id_text(t, colon) + " >= num_features " +
                          std::to_string(s.feature_limit) + (s.libsvm ? " (ids are 1-based)" : "")};
      }
      throw LineProblem{"feature id " + id_text(t, colon) + " is too large (at most " +
                        std::to_string(kMaxWidth - 1 + shift) + ")"};
    }
    if (colon + 1 == p) throw LineProblem{"feature " + excerpt(t, p) + " has no value"};
    const float v = parse_value(colon + 1, p);
    if (id <= prev) {
      if (id == prev) throw LineProblem{"duplicate feature id " + id_text(t, colon) + " on this line"};
      sorted = false;
    }
    prev = id;
    c.feature_ids.push_back(static_cast<int32_t>(id));
    c.feature_values.push_back(v);
  }
  const size_t n = c.feature_ids.size() - first;
  if (n > 0) {
    if (!sorted) {
      sort_row(c.feature_ids.data() + first, c.feature_values.data() + first, n, scratch, "feature", shift);
    }
    c.max_feature = std::max<int64_t>(c.max_feature, c.feature_ids.back());
  }
}

void parse_chunk(Chunk& c, const char* text, const Setup& s, std::atomic<bool>& stop) {
  // Upper bounds make the scratch arrays fixed-size: every line but the last
  // ends in '\n'; a feature takes at least 4 bytes ("1:1" and a separator),
  // a label at least 2 (a digit and a separator).
  const size_t bytes = c.length;
  const char* const text_end = text + bytes;
  c.feature_ptr = MappedArray<int64_t>(bytes + 2);
  c.label_ptr = MappedArray<int64_t>(bytes + 2);
  c.feature_ids = MappedArray<int32_t>(bytes / 4 + 2);
  c.feature_values = MappedArray<float>(bytes / 4 + 2);
  c.label_ids = MappedArray<int32_t>(bytes / 2 + 2);
  c.feature_ptr.push_back(0);
  c.label_ptr.push_back(0);
  std::vector<std::pair<int32_t, float>> scratch;
  const char* p = text;
  int64_t line = 0;
  while (p < text_end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(text_end - p)));
    const char* le = nl ? nl : text_end;
    const char* next = nl ? nl + 1 : text_end;
    while (le > p && (le[-1] == '\r' || is_blank(le[-1]))) --le;
    ++line;
    if ((line & 0x3fff) == 0) {
      if (stop.load(std::memory_order_relaxed)) return;
      if (interrupt_requested()) {
        stop.store(true);
        throw Interrupted();
      }
    }
    try {
      parse_line(p, le, s, c, scratch);
    } catch (LineProblem& problem) {
      c.failed = true;
      c.error_line = line;
      c.error = std::move(problem.what);
      stop.store(true);
      return;
    }
    if (le != p) c.last_nonblank = c.rows;
    ++c.rows;
    c.feature_ptr.push_back(static_cast<int64_t>(c.feature_ids.size()));
    c.label_ptr.push_back(static_cast<int64_t>(c.label_ids.size()));
    p = next;
  }
  c.complete = true;
}

// Lines that start in [b, e), where e is a line start or the end of the text.
int64_t count_lines(const char* b, const char* e) noexcept {
  int64_t n = 0;
  for (const char* p = b; p < e;) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(e - p)));
    ++n;
    if (!nl) break;
    p = nl + 1;
  }
  return n;
}

bool all_digits(const char* b, const char* e) noexcept {
  if (b == e) return false;
  for (; b < e; ++b) {
    if (*b < '0' || *b > '9') return false;
  }
  return true;
}

// False once [b, e) shows that the line it starts cannot be a header: a character
// other than a digit or a blank, or a fourth token.
bool may_be_header(const char* b, const char* e) noexcept {
  int tokens = 0;
  bool in_token = false;
  for (; b < e; ++b) {
    if (*b >= '0' && *b <= '9') {
      if (!in_token && ++tokens > 3) return false;
      in_token = true;
    } else if (is_blank(*b) || *b == '\r') {
      in_token = false;
    } else {
      return false;
    }
  }
  return true;
}

LoadedData parse_text(const TextSource& src, const ReadOptions& opt) {
  const std::string& name = src.name();
  const size_t size = src.size();
  auto fail = [&name](int64_t line, const std::string& what) -> DataError {
    return DataError(name + ":" + std::to_string(line) + ": " + what);
  };
  if (opt.num_features > kMaxWidth) throw InvalidArgument("num_features must be at most 2147483647");
  if (opt.num_labels > kMaxWidth) throw InvalidArgument("num_labels must be at most 2147483647");
  if (size == 0) throw fail(1, "empty file (expected a header '<num_points> <num_features> <num_labels>' or data lines)");

  // Line 1 decides the format: a header is exactly three integers. Read as much
  // of it as that takes (a libsvm file's first data line may be long).
  std::vector<char> head_buf;
  size_t head_len = std::min<size_t>(size, 1 << 16);
  const char* data = nullptr;
  const char* nl1 = nullptr;
  while (true) {
    data = src.read(0, head_len, head_buf);
    nl1 = static_cast<const char*>(std::memchr(data, '\n', head_len));
    if (nl1 != nullptr || head_len == size || !may_be_header(data, data + head_len)) break;
    head_len = std::min<size_t>(size, head_len * 2);
  }
  const char* e1 = nl1 ? nl1 : data + head_len;
  while (e1 > data && (e1[-1] == '\r' || is_blank(e1[-1]))) --e1;
  const char* tok[4];
  const char* tok_end[4];
  int ntok = 0;
  for (const char* p = data; p < e1 && ntok < 4;) {
    while (p < e1 && is_blank(*p)) ++p;
    if (p == e1) break;
    tok[ntok] = p;
    while (p < e1 && !is_blank(*p)) ++p;
    tok_end[ntok++] = p;
  }
  bool header_like = ntok == 3;
  for (int i = 0; i < ntok && header_like; ++i) header_like = all_digits(tok[i], tok_end[i]);

  LoadedData out;
  out.format = opt.format == DataFormat::kAuto ? (header_like ? DataFormat::kXC : DataFormat::kLibSVM) : opt.format;
  Setup s;
  s.libsvm = out.format == DataFormat::kLibSVM;
  int64_t declared_points = -1;
  int64_t header_lines = 0;
  size_t body = 0;  // offset of the first data line
  if (!s.libsvm) {
    if (!header_like) {
      throw fail(1, "header must be three integers '<num_points> <num_features> <num_labels>', found " +
                        excerpt(data, e1));
    }
    int64_t v[3] = {0, 0, 0};
    const char* names[3] = {"num_points", "num_features", "num_labels"};
    for (int i = 0; i < 3; ++i) {
      if (parse_id(tok[i], tok_end[i], v[i]) != IdStatus::kOk || (i > 0 && v[i] > kMaxWidth)) {
        throw fail(1, std::string("header ") + names[i] + " " + excerpt(tok[i], tok_end[i]) + " is too large" +
                          (i > 0 ? " (at most 2147483647)" : ""));
      }
    }
    declared_points = v[0];
    s.feature_limit = v[1];
    s.label_limit = v[2];
    s.features_given = s.labels_given = true;
    header_lines = 1;
    body = nl1 ? static_cast<size_t>(nl1 - data) + 1 : size;  // a header line was read whole
  }
  head_buf = std::vector<char>();  // a long first line of a libsvm file
  if (opt.num_features >= 0) {
    s.feature_limit = opt.num_features;
    s.features_given = true;
  }
  if (opt.num_labels >= 0) {
    s.label_limit = opt.num_labels;
    s.labels_given = true;
  }

  // Chunks own the lines that start inside them: about 1 MiB each (a thread holds
  // one chunk's text at a time), at least four per thread when the file is large
  // enough to be worth splitting.
  const int threads = resolve_threads(opt.num_threads);
  const size_t body_size = size - body;
  size_t nchunks = std::max<size_t>(body_size >> 20, static_cast<size_t>(threads) * 4);
  nchunks = std::min<size_t>(nchunks, std::max<size_t>(1, body_size >> 16));
  nchunks = std::min<size_t>(nchunks, 1 << 12);  // each chunk holds five mappings: stay far below vm.max_map_count
  std::vector<Chunk> chunks(nchunks);
  std::vector<char> scan_buf;
  size_t prev_end = body;
  for (size_t k = 0; k < nchunks; ++k) {
    const size_t b = prev_end;
    size_t e = k + 1 == nchunks ? size : body + body_size / nchunks * (k + 1);
    if (e < b) e = b;
    // Move e to the next line start, reading forward in windows.
    if (e > b && e < size && *src.read(e - 1, 1, scan_buf) != '\n') {
      while (true) {
        const size_t len = std::min<size_t>(size - e, 1 << 16);
        const char* w = src.read(e, len, scan_buf);
        const char* nl = static_cast<const char*>(std::memchr(w, '\n', len));
        if (nl != nullptr) {
          e += static_cast<size_t>(nl - w) + 1;
          break;
        }
        e += len;
        if (e == size) break;
      }
    }
    chunks[k].offset = b;
    chunks[k].length = e - b;
    prev_end = e;
  }
  scan_buf = std::vector<char>();

  // No more threads than chunks: waking idle threads costs more than a small file.
  const int team = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), nchunks));
  std::atomic<bool> stop{false};
  ExceptionCatcher catcher;
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
  for (int64_t k = 0; k < static_cast<int64_t>(nchunks); ++k) {
    catcher.run([&] {
      Chunk& c = chunks[static_cast<size_t>(k)];
      if (stop.load(std::memory_order_relaxed)) return;
      std::vector<char> buf;  // this chunk's text, freed once it is parsed
      parse_chunk(c, src.read(c.offset, c.length, buf), s, stop);
    });
  }
  catcher.rethrow();
  // A file changed under the reader would otherwise surface as a misleading line error.
  src.check_unchanged();
  for (size_t k = 0; k < nchunks; ++k) {
    if (!chunks[k].failed) continue;
    // Every earlier chunk either finished or stopped early: count its lines from the text.
    int64_t line = header_lines;
    std::vector<char> buf;
    for (size_t j = 0; j < k; ++j) {
      const Chunk& c = chunks[j];
      if (c.complete) {
        line += c.rows;
      } else {
        const char* text = src.read(c.offset, c.length, buf);
        line += count_lines(text, text + c.length);
      }
    }
    src.check_unchanged();
    throw fail(line + chunks[k].error_line, chunks[k].error);
  }

  // Rows, trailing blank lines, and the point count the header declared.
  int64_t total_rows = 0;
  int64_t last_nonblank = -1;
  std::vector<int64_t> row_offset(nchunks + 1, 0);
  for (size_t k = 0; k < nchunks; ++k) {
    if (chunks[k].last_nonblank >= 0) last_nonblank = total_rows + chunks[k].last_nonblank;
    total_rows += chunks[k].rows;
    row_offset[k + 1] = total_rows;
  }
  int64_t n = 0;
  if (!s.libsvm) {
    if (last_nonblank >= declared_points) {
      throw fail(header_lines + last_nonblank + 1,
                 "more data lines than the header declares (" + std::to_string(declared_points) + ")");
    }
    if (total_rows < declared_points) {
      throw fail(header_lines + total_rows,
                 "the file ends after " + std::to_string(total_rows) + " data lines but the header declares " +
                     std::to_string(declared_points));
    }
    n = declared_points;
  } else {
    n = last_nonblank + 1;
    if (n == 0) throw fail(1, "no data lines");
  }

  int64_t max_feature = -1;
  int64_t max_label = -1;
  std::vector<int64_t> feature_offset(nchunks + 1, 0);
  std::vector<int64_t> label_offset(nchunks + 1, 0);
  for (size_t k = 0; k < nchunks; ++k) {
    max_feature = std::max(max_feature, chunks[k].max_feature);
    max_label = std::max(max_label, chunks[k].max_label);
    feature_offset[k + 1] = feature_offset[k] + static_cast<int64_t>(chunks[k].feature_ids.size());
    label_offset[k + 1] = label_offset[k] + static_cast<int64_t>(chunks[k].label_ids.size());
  }
  out.num_points = n;
  out.num_features = s.features_given ? s.feature_limit : max_feature + 1;
  out.num_labels = s.labels_given ? s.label_limit : max_label + 1;

  // Rows past n are blank, so they carry no entries and are simply not copied.
  out.features.indptr.resize(static_cast<size_t>(n) + 1);
  out.features.indices.resize(static_cast<size_t>(feature_offset[nchunks]));
  out.features.values.resize(static_cast<size_t>(feature_offset[nchunks]));
  out.labels.indptr.resize(static_cast<size_t>(n) + 1);
  out.labels.indices.resize(static_cast<size_t>(label_offset[nchunks]));
  out.features.indptr[0] = 0;
  out.labels.indptr[0] = 0;
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
  for (int64_t k = 0; k < static_cast<int64_t>(nchunks); ++k) {
    Chunk& c = chunks[static_cast<size_t>(k)];
    const int64_t r0 = row_offset[k];
    const int64_t rows = std::min<int64_t>(c.rows, n - r0);
    for (int64_t r = 1; r <= rows; ++r) {
      out.features.indptr[static_cast<size_t>(r0 + r)] = feature_offset[k] + c.feature_ptr[static_cast<size_t>(r)];
      out.labels.indptr[static_cast<size_t>(r0 + r)] = label_offset[k] + c.label_ptr[static_cast<size_t>(r)];
    }
    if (c.feature_ids.size() > 0) {
      std::memcpy(out.features.indices.data() + feature_offset[k], c.feature_ids.data(),
                  c.feature_ids.size() * sizeof(int32_t));
      std::memcpy(out.features.values.data() + feature_offset[k], c.feature_values.data(),
                  c.feature_values.size() * sizeof(float));
    }
    if (c.label_ids.size() > 0) {
      std::memcpy(out.labels.indices.data() + label_offset[k], c.label_ids.data(),
                  c.label_ids.size() * sizeof(int32_t));
    }
    c = Chunk();  // free the scratch as soon as it is copied
  }
  return out;
}

}  // namespace

LoadedData read_dataset(const std::string& path, const ReadOptions& options) {
  return parse_text(TextSource::open_file(path), options);
}

LoadedData parse_dataset(std::string_view text, const std::string& name, const ReadOptions& options) {
  return parse_text(TextSource(text.data(), text.size(), name), options);
}

}  // namespace slide
