#include "embed.hpp"

#include <cmath>
#include <cstring>
#include <onnxruntime_float16.h>

namespace seer {
namespace {

int64_t tile_side(const Manifest& m) { return std::llround(std::sqrt(double(m.vision.tokens_per_tile))); }

// Python's float floor division (CPython float_floor_div), which the layout's downsampling uses.
double floor_div(double a, double b) {
  double mod = std::fmod(a, b), div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double floored = std::floor(div);
  return div - floored > 0.5 ? floored + 1.0 : floored;
}

// One value of the merged features, in the features' precision: numpy computes float16 arithmetic one operation
// at a time, each rounded to float16.
struct Values {
  const uint8_t* data;
  bool half;
  float at(size_t i) const {
    if (!half) return reinterpret_cast<const float*>(data)[i];
    return reinterpret_cast<const Ort::Float16_t*>(data)[i].ToFloat();
  }
  float round(float v) const { return half ? Ort::Float16_t(v).ToFloat() : v; }
};

void store(uint8_t* dest, size_t i, float v, bool half) {
  if (half) reinterpret_cast<Ort::Float16_t*>(dest)[i] = Ort::Float16_t(v);
  else reinterpret_cast<float*>(dest)[i] = v;
}

struct Taps {  // resize_bilinear's taps: half-pixel centres, as F.interpolate(align_corners=False)
  std::vector<int64_t> lo, hi;
  std::vector<float> w;
  Taps(int64_t src, int64_t dst, const Values& v) {
    for (int64_t i = 0; i < dst; ++i) {
      const double x = std::max((double(i) + 0.5) * (double(src) / double(dst)) - 0.5, 0.0);
      const int64_t l = std::min<int64_t>(static_cast<int64_t>(std::floor(x)), src - 1);
      lo.push_back(l), hi.push_back(std::min(l + 1, src - 1)), w.push_back(v.round(static_cast<float>(x - l)));
    }
  }
};

}  // namespace

AnyresLayout anyres_layout(int64_t cols, int64_t rows, int64_t side, int64_t width, int64_t height,
                           std::optional<int64_t> max_tiles) {
  const int64_t map_h = rows * side, map_w = cols * side;
  AnyresLayout l{side, 0, map_h, 0, map_w, 0, 0};
  if (double(width) / double(height) > double(map_w) / double(map_h)) {  // padding was above and below
    const int64_t kept = static_cast<int64_t>(double(height) * (double(map_w) / double(width)));
    const int64_t pad = (map_h - kept) / 2;
    l.top = pad, l.bottom = map_h - pad;
  } else {
    const int64_t kept = static_cast<int64_t>(double(width) * (double(map_h) / double(height)));
    const int64_t pad = (map_w - kept) / 2;
    l.left = pad, l.right = map_w - pad;
  }
  l.height = l.bottom - l.top, l.width = l.right - l.left;
  if (max_tiles) {
    const double times = std::sqrt(double(l.height * l.width) / double(*max_tiles * side * side));
    if (times > 1.1)  // at least one row and column
      l.height = std::max<int64_t>(1, int64_t(floor_div(double(l.height), times))),
      l.width = std::max<int64_t>(1, int64_t(floor_div(double(l.width), times)));
  }
  return l;
}

void merge_anyres(const uint8_t* features, const uint8_t* newline, const AnyresLayout& l, int64_t cols, int64_t rows,
                  int64_t d, const std::string& precision, uint8_t* dest) {
  const bool half = precision == "float16";
  const Values f{features, half}, nl{newline, half};
  const int64_t side = l.side, t = side * side;
  size_t out = 0;  // values written
  for (int64_t k = 0; k < t * d; ++k) store(dest, out++, f.at(k), half);  // the base tile
  // the grid's patch map, value (Y, X, c) from tile (Y / side, X / side), patch (Y % side, X % side)
  auto map = [&](int64_t y, int64_t x, int64_t c) {
    const int64_t tile = 1 + (y / side) * cols + (x / side), patch = (y % side) * side + (x % side);
    return f.at((tile * t + patch) * d + c);
  };
  const int64_t crop_h = l.bottom - l.top, crop_w = l.right - l.left;
  const bool resize = crop_h != l.height || crop_w != l.width;
  const Taps ty(crop_h, resize ? l.height : crop_h, f), tx(crop_w, resize ? l.width : crop_w, f);
  (void)rows;
  for (int64_t y = 0; y < l.height; ++y) {
    for (int64_t x = 0; x < l.width; ++x)
      for (int64_t c = 0; c < d; ++c) {
        float v;
        if (!resize) {
          v = map(l.top + y, l.left + x, c);
        } else {  // rows first, then columns, each op rounded as numpy does in the features' dtype
          auto row = [&](int64_t xx) {
            const float a = f.round(map(l.top + ty.lo[y], l.left + xx, c) * f.round(1.0f - ty.w[y]));
            const float b = f.round(map(l.top + ty.hi[y], l.left + xx, c) * ty.w[y]);
            return f.round(a + b);
          };
          const float a = f.round(row(tx.lo[x]) * f.round(1.0f - tx.w[x]));
          const float b = f.round(row(tx.hi[x]) * tx.w[x]);
          v = f.round(a + b);
        }
        store(dest, out++, v, half);
      }
    for (int64_t c = 0; c < d; ++c) store(dest, out++, nl.at(c), half);
  }
}

PromptEmbeds embed_prompt(Backend& backend, const Manifest& manifest, const Request& request,
                          std::atomic<int64_t>* clock) {
  const auto& ids = request.prompt_ids;
  if (ids.empty()) throw input_error("prompt_ids is empty; send the chat-formatted prompt ids (seer-prompt-ids)");
  int64_t placeholders = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == IMAGE_PLACEHOLDER) ++placeholders;
    else if (ids[i] < 0 || ids[i] >= manifest.vocab_size)
      throw input_error("prompt_ids[" + std::to_string(i) + "] is " + std::to_string(ids[i]) +
                        ", outside the vocabulary [0, " + std::to_string(manifest.vocab_size) + ") (or " +
                        std::to_string(IMAGE_PLACEHOLDER) + " for the image); encode the prompt with this export's "
                        "tokenizer (seer-prompt-ids)");
  }
  const bool image = request.tiles > 0 || !request.pixel_values.empty();
  if (image && manifest.vision.text_only())
    throw input_error("this export is a text-only model (vision.encoder none: Dream); send the prompt without an image");
  if (placeholders != (image ? 1 : 0))
    throw input_error("prompt_ids hold " + std::to_string(placeholders) + " image placeholder(s) (" +
                      std::to_string(IMAGE_PLACEHOLDER) + ") for " + std::to_string(image ? 1 : 0) +
                      " image(s); put one " + std::to_string(IMAGE_PLACEHOLDER) + " where the image goes per image");
  const int64_t s = manifest.vision.image_size, d = manifest.hidden_size;
  const size_t row_bytes = d * element_size(manifest.precision);
  const bool anyres = manifest.vision.anyres();
  int64_t features = 0;  // embeddings the image takes
  AnyresLayout layout;
  if (image) {
    const int64_t tiles = anyres ? 1 + request.grid_cols * request.grid_rows : 1;
    if (anyres && (request.grid_cols < 1 || request.grid_rows < 1 || request.image_width < 1 ||
                   request.image_height < 1))
      throw input_error("this export tiles images as '" + manifest.vision.image_aspect_ratio +
                        "': a request's image needs its grid (image_grid [cols, rows]) and its size in pixels "
                        "(image_size [width, height]) beside its tiles, as seer-prompt-ids writes them");
    if (request.tiles != tiles || request.pixel_values.size() != static_cast<size_t>(tiles * 3 * s * s))
      throw input_error("the image has " + std::to_string(request.tiles) + " tile(s) in " +
                        std::to_string(request.pixel_values.size()) + " floats; this export takes " +
                        std::to_string(tiles) + " tile(s) of 3 x " + std::to_string(s) + " x " + std::to_string(s) +
                        " = " + std::to_string(tiles * 3 * s * s) + " floats (seer-prompt-ids --tiles writes them)");
    if (anyres) {
      layout = anyres_layout(request.grid_cols, request.grid_rows, tile_side(manifest), request.image_width,
                             request.image_height, manifest.vision.anyres_max_tiles);
      features = layout.tokens();
    } else {
      features = manifest.vision.tokens_per_tile + (manifest.vision.newline == "unpad" ? 1 : 0);
    }
  }
  PromptEmbeds out;
  out.length = static_cast<int64_t>(ids.size()) - placeholders + features;
  const int64_t largest = manifest.buckets.prompt.back();
  if (out.length > largest)
    throw input_error("the prompt takes " + std::to_string(out.length) + " embeddings (text and image features), "
                      "more than the largest prompt bucket " + std::to_string(largest) +
                      "; shorten it or re-export with larger buckets");
  out.embeds.resize(out.length * row_bytes);
  const std::string& embeds_dtype = manifest.graph("embed").outputs.at(0).dtype;
  int64_t at = 0;  // rows written
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] == IMAGE_PLACEHOLDER) {
      const auto& vision = manifest.graph(manifest.vision.graph());
      const int64_t t = manifest.vision.tokens_per_tile;
      std::vector<float> pixels32 = request.pixel_values;
      std::vector<Ort::Float16_t> pixels16;
      void* pixels = pixels32.data();
      const std::string& pdtype = vision.inputs.at(0).dtype;
      if (pdtype == "float16") {  // round to nearest even, as numpy's astype does
        for (float v : pixels32) pixels16.emplace_back(v);
        pixels = pixels16.data();
      }
      if (manifest.vision.image_ids()) {  // MMaDA: the tokenizer's codes as vocabulary ids, embedded as text is
        std::vector<int64_t> codes(t);
        {
          GraphCall call = backend.call("image_tokens", clock);
          call.input(vision.inputs.at(0).name.c_str(), pixels, pdtype, {1, 3, s, s});
          call.output("image_ids", codes.data(), "int64", {1, t});
          call.run();
        }
        GraphCall call = backend.call("embed", clock);
        call.input("input_ids", codes.data(), "int64", {1, t});
        call.output("embeds", out.embeds.data() + at * row_bytes, embeds_dtype, {1, t, d});
        call.run();
        at += features;
        ++i;
        continue;
      }
      std::vector<uint8_t> tiles(request.tiles * t * row_bytes), newline(row_bytes);
      GraphCall call = backend.call("vision", clock);
      call.input(vision.inputs.at(0).name.c_str(), pixels, pdtype, {request.tiles, 3, s, s});
      call.output("image_features", tiles.data(), manifest.precision, {request.tiles, t, d});
      call.output("image_newline", newline.data(), manifest.precision, {d});
      call.run();
      uint8_t* dest = out.embeds.data() + at * row_bytes;
      if (anyres) {
        merge_anyres(tiles.data(), newline.data(), layout, request.grid_cols, request.grid_rows, d,
                     manifest.precision, dest);
      } else {
        std::memcpy(dest, tiles.data(), t * row_bytes);
        if (manifest.vision.newline == "unpad") std::memcpy(dest + t * row_bytes, newline.data(), row_bytes);
      }
      at += features;
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && ids[j] != IMAGE_PLACEHOLDER) ++j;
    std::vector<int64_t> chunk(ids.begin() + i, ids.begin() + j);
    const int64_t len = static_cast<int64_t>(chunk.size());
    GraphCall call = backend.call("embed", clock);
    call.input("input_ids", chunk.data(), "int64", {1, len});
    call.output("embeds", out.embeds.data() + at * row_bytes, embeds_dtype, {1, len, d});
    call.run();
    at += len;
    i = j;
  }
  return out;
}

std::vector<uint8_t> embed_token(Backend& backend, const Manifest& manifest, int64_t id, std::atomic<int64_t>* clock) {
  const int64_t d = manifest.hidden_size;
  std::vector<uint8_t> out(d * element_size(manifest.precision));
  GraphCall call = backend.call("embed", clock);
  call.input("input_ids", &id, "int64", {1, 1});
  call.output("embeds", out.data(), manifest.graph("embed").outputs.at(0).dtype, {1, 1, d});
  call.run();
  return out;
}

}  // namespace seer
