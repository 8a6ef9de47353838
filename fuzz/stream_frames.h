// The byte format the compress-stream fuzzer reads and its seed writer writes: a Compress
// stream's requests as frames of [uint16 little-endian length][that many bytes of a
// serialized CompressRequest], as gRPC would hand them to the reactor one message at a time.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace centroidkv::fuzz {

// Appends one frame holding `message` (at most 65535 bytes) to `out`.
inline void AppendFrame(std::string_view message, std::string* out) {
  const size_t size = message.size() > 0xffff ? 0xffff : message.size();
  out->push_back(static_cast<char>(size & 0xff));
  out->push_back(static_cast<char>(size >> 8));
  out->append(message.data(), size);
}

// Reads frames off the front of a buffer; a short last frame is cut to what is left.
class FrameReader {
 public:
  FrameReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool Next(std::string_view* frame) {
    if (size_ < 2) return false;
    size_t length = static_cast<size_t>(data_[0]) | (static_cast<size_t>(data_[1]) << 8);
    data_ += 2;
    size_ -= 2;
    if (length > size_) length = size_;
    *frame = std::string_view(reinterpret_cast<const char*>(data_), length);
    data_ += length;
    size_ -= length;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace centroidkv::fuzz
