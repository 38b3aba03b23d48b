// Stage 1, preprocess: a request's prompt ids and pixel tiles -> its prompt embeddings [P, D] (seer_trt/embed.py).
//
// In:  chat-formatted prompt ids (IMAGE_PLACEHOLDER where the image goes), an image's preprocessed tiles
//      [tiles, 3, S, S] float32, the backend's embed and vision graphs.
// Out: the embeddings [P, D] in the graphs' precision: each run of text ids through `embed` (written straight
//      into place), the image's features through `vision`, then image_newline under "unpad" merging ("pad"
//      exports: one tile). Ids are checked first: a bad request fails before any graph runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend.hpp"

namespace seer {

struct PromptEmbeds {
  std::vector<uint8_t> embeds;  // [P, D] in the graphs' precision
  int64_t length = 0;           // P
};

// Throws input_error for ids out of range, a placeholder count that is not the image count, tiles of the wrong
// size, or a prompt longer than the largest prompt bucket.
PromptEmbeds embed_prompt(Backend& backend, const Manifest& manifest, const Request& request,
                          std::atomic<int64_t>* clock);

}  // namespace seer
