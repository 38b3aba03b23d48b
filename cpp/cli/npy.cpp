#include "npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "seer/seer.hpp"

namespace seer_run {
namespace {

// numpy's own cap on a header it reads (numpy.lib.format, max_header_size): np.save writes about 128 bytes
constexpr uint32_t MAX_HEADER = 10000;
constexpr char FIX[] = "; regenerate it with seer-prompt-ids --tiles";

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "'<f4' tiles are read into floats as they lie");

seer::Error refused(const std::string& path, const std::string& what) {
  return seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " " + what + FIX);
}

struct Header {
  std::string descr;                  // '<f4' for little-endian float32
  std::optional<bool> fortran_order;  // False: C order
  std::vector<int64_t> shape;
  bool has_shape = false;
};

// The header dict np.save writes, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 384, 384), }": string,
// boolean and tuple-of-whole-number values and nothing else, as numpy.lib.format reads it (a Python literal).
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : text_(text) {}

  bool parse(Header& h) {
    if (!take('{')) return false;
    while (!take('}')) {
      std::string key;
      if (!quoted(key) || !take(':')) return false;
      if (key == "descr" && !quoted(h.descr)) return false;
      if (key == "fortran_order" && !(h.fortran_order = boolean())) return false;
      if (key == "shape" && !(h.has_shape = tuple(h.shape))) return false;
      if (key != "descr" && key != "fortran_order" && key != "shape") return false;  // numpy refuses other keys
      if (!take(',') && !peek('}')) return false;
    }
    skip();
    return at_ == text_.size();
  }

 private:
  void skip() {
    while (at_ < text_.size() && std::strchr(" \t\n\r", text_[at_]) && text_[at_]) ++at_;
  }
  bool peek(char c) {
    skip();
    return at_ < text_.size() && text_[at_] == c;
  }
  bool take(char c) { return peek(c) && (++at_, true); }
  bool quoted(std::string& out) {
    skip();
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) return false;
    const size_t end = text_.find(text_[at_], at_ + 1);
    if (end == std::string::npos) return false;
    out = text_.substr(at_ + 1, end - at_ - 1);
    at_ = end + 1;
    return true;
  }
  std::optional<bool> boolean() {
    skip();
    for (const bool value : {true, false}) {
      const std::string word = value ? "True" : "False";
      if (text_.compare(at_, word.size(), word) == 0) {
        at_ += word.size();
        return value;
      }
    }
    return std::nullopt;
  }
  bool whole(int64_t& value) {  // a non-negative Python int that fits int64
    skip();
    const size_t from = at_;
    for (value = 0; at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9'; ++at_) {
      if (value > (std::numeric_limits<int64_t>::max() - (text_[at_] - '0')) / 10) return false;
      value = value * 10 + (text_[at_] - '0');
    }
    return at_ > from;
  }
  bool tuple(std::vector<int64_t>& out) {  // "()", "(3,)", "(1, 3, 32, 32)"
    if (!take('(')) return false;
    for (int64_t v; !take(')');) {
      if (out.size() >= 64 || !whole(v)) return false;  // NPY_MAXDIMS (64 since numpy 2.0, 32 before)
      out.push_back(v);
      if (!take(',') && !peek(')')) return false;
    }
    return true;
  }

  const std::string& text_;
  size_t at_ = 0;
};

std::string shape_text(const std::vector<int64_t>& shape) {  // as Python prints the tuple
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

struct File {  // a descriptor closed on every way out
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `count` bytes at `offset`; false when the file ends first (it shrank since fstat) or a read fails.
bool read_at(int fd, char* out, size_t count, off_t offset) {
  while (count) {
    const ssize_t got = ::pread(fd, out, count, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got, count -= got, offset += got;
  }
  return true;
}

// A regular file, refused without opening anything else: stat first (opening some devices has effects), then open
// with O_NONBLOCK (a FIFO swapped in since stat opens at once instead of waiting for a writer) and fstat what opened.
void open_regular(const std::string& path, File& file, struct stat& info) {
  auto check = [&](int status) {
    if (status == 0 && S_ISREG(info.st_mode)) return;
    if (status != 0 && errno == ENOENT)
      throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " does not exist; pass a .npy file");
    if (status != 0)
      throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " cannot be read (" +
                                                      std::strerror(errno) + "); pass a readable .npy file");
    const char* kind = S_ISFIFO(info.st_mode) ? "a FIFO" : S_ISDIR(info.st_mode) ? "a folder"
                       : S_ISSOCK(info.st_mode) ? "a socket" : "a device";
    throw refused(path, std::string("is ") + kind + ", not a regular file of tiles");
  };
  check(::stat(path.c_str(), &info));
  file.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  check(file.fd < 0 ? -1 : ::fstat(file.fd, &info));
}

}  // namespace

std::vector<float> read_tiles(const std::string& path, const TileShape& want, int64_t& tiles) {
  File file;
  struct stat info {};
  open_regular(path, file, info);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  unsigned char pre[12] = {};  // magic "\x93NUMPY", version major and minor, header length (2 bytes in 1.x, else 4)
  if (size < 10 || !read_at(file.fd, reinterpret_cast<char*>(pre), 10, 0) || std::memcmp(pre, "\x93NUMPY", 6) != 0 ||
      pre[6] < 1 || pre[6] > 3)
    throw refused(path, "is not a .npy file of format 1-3 (np.save writes one)");
  const uint32_t preamble = pre[6] == 1 ? 10 : 12;
  if (preamble == 12 && (size < 12 || !read_at(file.fd, reinterpret_cast<char*>(pre) + 10, 2, 10)))
    throw refused(path, "ends inside its .npy preamble");
  const uint32_t len = pre[8] | (pre[9] << 8) | (preamble == 12 ? (pre[10] << 16) | (uint32_t(pre[11]) << 24) : 0);
  if (len > MAX_HEADER || preamble + len > size)
    throw refused(path, "claims a " + std::to_string(len) + "-byte header in " + std::to_string(size) +
                            " bytes (numpy reads headers up to " + std::to_string(MAX_HEADER) + " bytes)");
  std::string text(len, '\0');
  Header h;
  if (!read_at(file.fd, text.data(), len, preamble) || !HeaderParser(text).parse(h) || !h.fortran_order ||
      !h.has_shape || h.descr.empty())
    throw refused(path, "has no .npy header numpy would read (descr, fortran_order, shape)");

  const int64_t s = want.image_size;
  const std::string expected = "expected float32 ('<f4') [tiles, 3, " + std::to_string(s) + ", " + std::to_string(s) +
                               "] in C order, 1 <= tiles <= " + std::to_string(want.max_tiles) +
                               " (this export's vision image_size and tiling)";
  if (h.descr != "<f4" || *h.fortran_order)
    throw refused(path, "holds '" + h.descr + "'" + (*h.fortran_order ? " in Fortran order" : "") + "; " + expected);
  const auto& d = h.shape;
  const size_t rank = d.size();
  const int64_t count = rank == 4 ? d[0] : 1;
  if ((rank != 3 && rank != 4) || d[rank - 3] != 3 || d[rank - 2] != s || d[rank - 1] != s || count < 1 ||
      count > want.max_tiles)
    throw refused(path, "claims shape " + shape_text(d) + "; " + expected);
  uint64_t bytes = sizeof(float);  // of the data; tiles, S and 3 are bounded now, the product is checked all the same
  for (int64_t v : d)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(v), &bytes))
      throw refused(path, "claims shape " + shape_text(d) + ", more bytes than a 64-bit size holds; " + expected);
  if (size - (preamble + len) != bytes)
    throw refused(path, "claims shape " + shape_text(d) + ", " + std::to_string(bytes) + " bytes of float32, but " +
                            std::to_string(size - preamble - len) + " bytes follow its " +
                            std::to_string(preamble + len) + "-byte header");
  std::vector<float> data(bytes / sizeof(float));
  if (!read_at(file.fd, reinterpret_cast<char*>(data.data()), bytes, preamble + len))
    throw refused(path, "is shorter than its shape says (it changed while being read)");
  tiles = count;
  return data;
}

}  // namespace seer_run
