// .npy parsing and writing: a magic string, a version, a Python-literal header dict
// ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }) padded to 64 bytes, then
// raw data. See numpy.lib.format.
#include "centroidkv/common/npy.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace centroidkv {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct TypeInfo {
  NpyType type;
  const char* descr;
  int32_t size;
};
constexpr TypeInfo kTypes[] = {
    {NpyType::kFloat32, "<f4", 4}, {NpyType::kFloat16, "<f2", 2}, {NpyType::kUInt32, "<u4", 4},
    {NpyType::kInt32, "<i4", 4},   {NpyType::kInt64, "<i8", 8},   {NpyType::kUInt64, "<u8", 8},
    {NpyType::kUInt8, "|u1", 1},  // fp8 codes
};

// Finds the value text of `key` in the header dict: what follows "'key':" up to the next
// top-level comma (or the closing parenthesis of a tuple).
absl::StatusOr<std::string> HeaderValue(const std::string& name, const std::string& header,
                                        const std::string& key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t pos = header.find(quoted);
  if (pos == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": .npy header has no '", key, "' entry"));
  }
  pos = header.find(':', pos + quoted.size());
  if (pos == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": malformed .npy header"));
  }
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  if (pos < header.size() && header[pos] == '(') {
    const size_t close = header.find(')', pos);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": malformed shape in .npy header"));
    }
    return header.substr(pos, close - pos + 1);
  }
  const size_t end = header.find_first_of(",}", pos);
  return header.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
}

}  // namespace

std::string NpyDescr(NpyType type) {
  for (const TypeInfo& info : kTypes) {
    if (info.type == type) return info.descr;
  }
  return "?";
}

int32_t NpyTypeSize(NpyType type) {
  for (const TypeInfo& info : kTypes) {
    if (info.type == type) return info.size;
  }
  return 0;
}

int64_t NpyArray::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

absl::StatusOr<NpyArray> ParseNpy(const std::string& name, const std::vector<uint8_t>& file) {
  if (file.size() < kMagicSize + 4 || std::memcmp(file.data(), kMagic, kMagicSize) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a .npy file (bad magic)"));
  }
  const uint8_t major = file[6];
  size_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len = file[8] | (file[9] << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": truncated .npy header"));
    }
    header_len = static_cast<size_t>(file[8]) | (static_cast<size_t>(file[9]) << 8) |
                 (static_cast<size_t>(file[10]) << 16) | (static_cast<size_t>(file[11]) << 24);
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unsupported .npy version ", static_cast<int>(major)));
  }
  if (header_start + header_len > file.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": truncated .npy header"));
  }
  const std::string header(reinterpret_cast<const char*>(file.data()) + header_start,
                           header_len);

  NpyArray array;
  auto descr = HeaderValue(name, header, "descr");
  if (!descr.ok()) return descr.status();
  const std::string descr_text(absl::StripSuffix(absl::StripPrefix(*descr, "'"), "'"));
  bool known = false;
  for (const TypeInfo& info : kTypes) {
    // '|' marks single-byte types; '<' little-endian. Accept '=' as native (x86: little).
    if (descr_text == info.descr || descr_text == absl::StrCat("=", info.descr + 1)) {
      array.type = info.type;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unsupported dtype '", descr_text,
                     "' (expected little-endian float32, float16, uint32, int32 or int64)"));
  }

  auto fortran = HeaderValue(name, header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (absl::StripAsciiWhitespace(*fortran) != "False") {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": Fortran-order arrays are not supported; save a C-order array"));
  }

  auto shape_text = HeaderValue(name, header, "shape");
  if (!shape_text.ok()) return shape_text.status();
  absl::string_view inner = absl::StripSuffix(absl::StripPrefix(*shape_text, "("), ")");
  for (absl::string_view part : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": bad shape ", *shape_text, " in .npy header"));
    }
    array.shape.push_back(dim);
  }

  // The element count and byte size, refused on overflow: a wrapped product could match a
  // short file and hand out a shape far larger than the data (found by fuzz/npy_fuzzer.cc).
  uint64_t elements = 1;
  uint64_t expected = 0;
  for (int64_t dim : array.shape) {
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": shape ", *shape_text, " in .npy header is too large"));
    }
  }
  if (__builtin_mul_overflow(elements, static_cast<uint64_t>(NpyTypeSize(array.type)),
                             &expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": shape ", *shape_text, " in .npy header is too large"));
  }
  const size_t data_start = header_start + header_len;
  if (file.size() - data_start != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": .npy data is ", file.size() - data_start, " bytes but shape ", *shape_text,
        " of ", descr_text, " needs ", expected));
  }
  array.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(data_start), file.end());
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  }
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
  return ParseNpy(path, file);
}

absl::Status WriteNpy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
                      const void* data) {
  std::string shape_text = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) shape_text += ",";
  std::string header = absl::StrCat("{'descr': '", NpyDescr(type),
                                    "', 'fortran_order': False, 'shape': (", shape_text, "), }");
  // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64.
  const size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open for writing"));
  }
  int64_t elements = 1;
  for (int64_t dim : shape) elements *= dim;
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  const char version[2] = {1, 0};
  const char length[2] = {static_cast<char>(header_len & 0xff),
                          static_cast<char>(header_len >> 8)};
  out.write(kMagic, kMagicSize);
  out.write(version, 2);
  out.write(length, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data),
            static_cast<std::streamsize>(elements * NpyTypeSize(type)));
  if (!out) {
    return absl::DataLossError(absl::StrCat(path, ": write failed"));
  }
  return absl::OkStatus();
}

}  // namespace centroidkv
