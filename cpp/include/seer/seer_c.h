/* seer-trt's C ABI over the C++ runtime (seer/seer.hpp), for Go, Rust, C# and ctypes.
 *
 *   seer_pipeline* p = seer_open("engines/tiny-llada-v-fp32", keys, values, n);   NULL on error
 *   seer_results* r = seer_generate(p, requests, count, NULL);                     NULL on error
 *   ... r->items[i].token_ids, .kept, .steps, .error ...
 *   seer_results_free(r); seer_close(p);
 *   seer_last_error(): this thread's last error, "" when none.
 *
 * Options are key/value strings: ort_library, provider (cpu | cuda | tensorrt), device_id, threads, policy,
 * tau_pad, short, share_weights (0 | 1), cache (none | reuse | forecast; default reuse), refresh_interval (default 8),
 * forecast_order, kv_budget (bytes of the prompt K/V pool; default a quarter of the machine's memory).
 * A zero-initialised seer_request takes the export's defaults with Seer on.
 * A pipeline may be used from several threads at once. */
#ifndef SEER_C_H
#define SEER_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEER_C_ABI_VERSION 4 /* 2: the prompt K/V cache (seer_request.cache, seer_result.refreshes);
                                3: seer_request.decoding; 4: seer_request.remasking */
#define SEER_IMAGE_PLACEHOLDER (-200)

typedef struct seer_pipeline seer_pipeline;

typedef struct {
  const int64_t* prompt_ids; /* chat-formatted ids; SEER_IMAGE_PLACEHOLDER where the image goes */
  size_t prompt_len;
  const float* pixel_values; /* [tiles, 3, S, S] float32 tiles, NULL for no image */
  int64_t tiles;
  int64_t grid_cols, grid_rows, image_width, image_height; /* anyres exports only */
  int64_t gen_length, steps, block_length; /* 0: the export's default */
  int64_t window;                          /* 0: none; else the oracle window, no step zero */
  int32_t no_seer;                         /* 1: the padded baseline */
  int32_t early_stop;                      /* 1: stop at <|eot_id|> (LLaDA-V's stopping criterion) */
  const char* cache;                       /* "none" | "reuse" | "forecast"; NULL: the pipeline's */
  int64_t refresh_interval;                /* 0: the pipeline's */
  const char* decoding; /* "fixed" | "threshold:TAU" | "factor:F" (how many positions a step commits); NULL: the
                           export's */
  const char* remasking; /* "low_confidence", or a Dream export's "topk_margin" / "entropy"; NULL: the export's */
} seer_request;

enum {
  SEER_PREPROCESS, SEER_STEP_ZERO, SEER_BOUNDARY, SEER_DISPATCH, SEER_PACKING, SEER_DENOISE, SEER_DETOKENIZE,
  SEER_GRAPHS, SEER_NUM_TIMINGS
};

typedef struct {
  const int64_t* token_ids; /* the answer: ids before the first <|eot_id|> */
  size_t num_tokens;
  const int64_t* window; /* every kept position's id */
  size_t window_len;
  int64_t kept, steps, gen_length;
  double seconds[SEER_NUM_TIMINGS]; /* per stage; SEER_GRAPHS: of them, inside ONNX Runtime */
  const char* text;                 /* UTF-8 answer, NULL when the tokenizer's decoder is not readable in C++ */
  const char* error;                /* NULL when the request was answered */
  int64_t refreshes;                /* denoising steps that computed the prompt */
} seer_result;

typedef struct {
  size_t count;
  seer_result* items;
} seer_results;

int seer_abi_version(void);
seer_pipeline* seer_open(const char* folder, const char* const* option_keys, const char* const* option_values,
                         size_t num_options);
seer_results* seer_generate(seer_pipeline* pipeline, const seer_request* requests, size_t count, const char* policy);
void seer_results_free(seer_results* results);
void seer_close(seer_pipeline* pipeline);
const char* seer_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SEER_C_H */
