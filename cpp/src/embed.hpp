// Stage 1, preprocess: a request's prompt ids and pixel tiles -> its prompt embeddings [P, D] (seer_trt/runtime/embed.py).
//
// In:  chat-formatted prompt ids (IMAGE_PLACEHOLDER where the image goes), an image's preprocessed tiles
//      [tiles, 3, S, S] float32, the backend's embed and vision graphs.
// Out: the embeddings [P, D] in the graphs' precision: each run of text ids through `embed` (written straight
//      into place), the image's features through `vision`, then image_newline under "unpad" merging ("pad"
//      exports: one tile). Ids are checked first: a bad request fails before any graph runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend.hpp"

namespace seer {

// Feature geometry of one anyres image under spatial_unpad merging (seer_trt.contracts.geometry.anyres_layout).
struct AnyresLayout {
  int64_t side = 0;                                   // patches per tile side
  int64_t top = 0, bottom = 0, left = 0, right = 0;   // the crop of the grid's patch map that unpadding keeps
  int64_t height = 0, width = 0;                      // the kept map after anyres_max downsampling
  int64_t tokens() const { return side * side + height * (width + 1); }
};

AnyresLayout anyres_layout(int64_t cols, int64_t rows, int64_t side, int64_t width, int64_t height,
                           std::optional<int64_t> max_tiles);
// [1 + cols * rows, T, D] tile features -> the image's [tokens, D] prompt features (seer_trt.runtime.embed.merge_anyres):
// the base tile, then each row of the cropped (and bilinearly shrunk) patch map followed by image_newline.
void merge_anyres(const uint8_t* features, const uint8_t* newline, const AnyresLayout& layout, int64_t cols,
                  int64_t rows, int64_t d, const std::string& precision, uint8_t* dest);

struct PromptEmbeds {
  std::vector<uint8_t> embeds;  // [P, D] in the graphs' precision
  int64_t length = 0;           // P
};

// Throws input_error for ids out of range, a placeholder count that is not the image count, tiles of the wrong
// size, or a prompt longer than the largest prompt bucket.
PromptEmbeds embed_prompt(Backend& backend, const Manifest& manifest, const Request& request,
                          std::atomic<int64_t>* clock);

// [D] the embedding of one token id (Seer's end tail holds copies of it), in the graphs' precision.
std::vector<uint8_t> embed_token(Backend& backend, const Manifest& manifest, int64_t id, std::atomic<int64_t>* clock);

}  // namespace seer
