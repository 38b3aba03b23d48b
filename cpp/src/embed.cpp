#include "embed.hpp"

#include <cstring>
#include <onnxruntime_float16.h>

namespace seer {

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
  if (placeholders != (image ? 1 : 0))
    throw input_error("prompt_ids hold " + std::to_string(placeholders) + " image placeholder(s) (" +
                      std::to_string(IMAGE_PLACEHOLDER) + ") for " + std::to_string(image ? 1 : 0) +
                      " image(s); put one " + std::to_string(IMAGE_PLACEHOLDER) + " where the image goes per image");
  const int64_t s = manifest.vision.image_size, d = manifest.hidden_size;
  const size_t row_bytes = d * element_size(manifest.precision);
  int64_t features = 0;  // embeddings the image takes
  if (image) {
    if (manifest.vision.anyres())
      throw input_error("this export tiles images as '" + manifest.vision.image_aspect_ratio +
                        "', whose feature merging the C++ runtime does not have yet; run image requests through "
                        "seer-run (Python), or export with one tile per image (pad)");
    if (request.tiles != 1 || request.pixel_values.size() != static_cast<size_t>(3 * s * s))
      throw input_error("the image has " + std::to_string(request.tiles) + " tile(s) in " +
                        std::to_string(request.pixel_values.size()) + " floats; this export takes 1 tile of 3 x " +
                        std::to_string(s) + " x " + std::to_string(s) + " = " + std::to_string(3 * s * s) +
                        " floats (seer-prompt-ids --tiles writes them)");
    features = manifest.vision.tokens_per_tile + (manifest.vision.newline == "unpad" ? 1 : 0);
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
      const auto& vision = manifest.graph("vision");
      const int64_t t = manifest.vision.tokens_per_tile;
      std::vector<float> pixels32 = request.pixel_values;
      std::vector<Ort::Float16_t> pixels16;
      void* pixels = pixels32.data();
      const std::string& pdtype = vision.inputs.at(0).dtype;
      if (pdtype == "float16") {  // round to nearest even, as numpy's astype does
        for (float v : pixels32) pixels16.emplace_back(v);
        pixels = pixels16.data();
      }
      std::vector<uint8_t> tile(t * row_bytes), newline(row_bytes);
      GraphCall call = backend.call("vision", clock);
      call.input(vision.inputs.at(0).name.c_str(), pixels, pdtype, {1, 3, s, s});
      call.output("image_features", tile.data(), manifest.precision, {1, t, d});
      call.output("image_newline", newline.data(), manifest.precision, {d});
      call.run();
      std::memcpy(out.embeds.data() + at * row_bytes, tile.data(), tile.size());
      at += t;
      if (manifest.vision.newline == "unpad") std::memcpy(out.embeds.data() + at++ * row_bytes, newline.data(), row_bytes);
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

}  // namespace seer
