// A request's image tiles from a .npy file (numpy's format, versions 1-3: what seer-prompt-ids --tiles writes),
// bounded by the export before any of it is held.
//
// In:  the image_tiles path of a request line, and the export's tile shape: S (vision image_size) and the most tiles
//      one image may have (seer::Pipeline::max_tiles, seer_trt.contracts.profiles.tiles_per_image).
// Out: float32 [tiles, 3, S, S] in C order, and tiles (1 for a [3, S, S] file).
//
// Only a regular file is opened (a FIFO without a writer would hang the batch, a device never ends), and nothing past
// its header is allocated or read until the header says '<f4', fortran_order False and a shape of at most that many
// [3, S, S] tiles, and the file holds exactly that shape's bytes after the header: a file of 82 bytes cannot make
// the CLI zero gigabytes. Every refusal is one seer::Error (Input) naming the file, what it claims, the limit and
// the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace seer_run {

struct TileShape {
  int64_t image_size = 0;  // S: tiles are [3, S, S]
  int64_t max_tiles = 1;   // tiles one image may have: 1 ("pad"), or the base tile + the largest anyres grid
};

std::vector<float> read_tiles(const std::string& path, const TileShape& shape, int64_t& tiles);

}  // namespace seer_run
