/* seer-trt's C ABI over the C++ runtime (seer/seer.hpp), for Go, Rust, C# and ctypes.
 *
 *   seer_pipeline* p = seer_open("engines/tiny-llada-v-fp32", keys, values, n);   NULL on error
 *   seer_request q = seer_request_defaults();  q.prompt_ids = ids; q.prompt_len = n; q.temperature = 0.8; ...
 *   seer_results* r = seer_generate(p, &q, 1, NULL);                              NULL on error
 *   ... r->items[i].token_ids, .kept, .steps, .error ...
 *   seer_results_free(r); seer_close(p);
 *   seer_last_error(): this thread's last error, "" when none.
 *
 * Options are key/value strings: ort_library, provider (cpu | cuda | tensorrt), device_id, threads, policy,
 * tau_pad, short, share_weights (0 | 1), cache (none | reuse | forecast; default reuse), refresh_interval (default 8),
 * forecast_order, kv_budget (bytes of the prompt K/V pool; default a quarter of the machine's memory).
 * A request starts from seer_request_defaults() (struct_size set, every field its default); every field but
 * struct_size and temperature takes its default at 0 too.
 *
 * Growing without breaking (ABI 5 on): seer_request's first member is struct_size, sizeof(seer_request) as the caller
 * compiled it, and a request array's stride. Later versions only append fields, whose 0 is their default: the library
 * reads the fields inside struct_size and takes the default for the rest, so a caller built against an older header
 * (ABI >= 5) keeps its answers; a caller built against a newer one is answered when every field this library lacks is
 * 0, and refused (NULL, seer_last_error naming the byte) when it sets one, as Linux's openat2 and clone3 read their
 * structs. A caller built before ABI 5 (no struct_size: its first member is the prompt_ids pointer) is refused with
 * that error, never misread.
 *
 * The request carries every field of seer-trt's request schema (seer_trt/contracts/) by its name: image, gen_length,
 * steps, seer, decoding, early_stop, remasking, temperature, seed, top_p, stop, cache, refresh_interval, window; its
 * system and history are formatted by the caller into prompt_ids (seer-prompt-ids prints them: --system, or a JSONL
 * line's system and history).
 * A pipeline may be used from several threads at once. */
#ifndef SEER_C_H
#define SEER_C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEER_C_ABI_VERSION 5 /* 2: the prompt K/V cache (seer_request.cache, seer_result.refreshes);
                                3: seer_request.decoding; 4: seer_request.remasking; 5: seer_request.struct_size, the
                                image's fields in seer_request.image, no_seer as seer, temperature, seed, top_p, stop */
#define SEER_IMAGE_PLACEHOLDER (-200)

typedef struct seer_pipeline seer_pipeline;

typedef struct {
  const float* pixel_values; /* [tiles, 3, S, S] float32 tiles, NULL for no image (seer-prompt-ids --tiles) */
  int64_t tiles;
  int64_t grid_cols, grid_rows, width, height; /* anyres exports only: the tile grid, the image's size in pixels */
} seer_image;

#define SEER_OFF (-1) /* seer_request.seer: the padded baseline */

typedef struct {
  size_t struct_size;        /* sizeof(seer_request) as compiled (seer_request_defaults sets it) */
  const int64_t* prompt_ids; /* chat-formatted ids, system and history formatted in by the caller (seer-prompt-ids);
                                SEER_IMAGE_PLACEHOLDER where the image goes */
  size_t prompt_len;
  seer_image image;
  int64_t gen_length, steps, block_length; /* 0: the export's default */
  int64_t window;                          /* 0: none; else the oracle window, no step zero */
  int32_t seer;                            /* 0 or 1: Seer on (the schema's seer true); SEER_OFF: the padded baseline */
  int32_t early_stop;                      /* 1: stop at <|eot_id|> (LLaDA-V's stopping criterion) */
  const char* cache;                       /* "none" | "reuse" | "forecast"; NULL: the pipeline's */
  int64_t refresh_interval;                /* 0: the pipeline's */
  const char* decoding; /* "fixed" | "threshold:TAU" | "factor:F" (how many positions a step commits); NULL: the
                           export's */
  const char* remasking; /* "low_confidence", "random", or a Dream export's "topk_margin" / "entropy"; NULL: the
                            export's */
  double temperature;    /* 0: greedy; (0, 2]: sampled; < 0: the export's (seer_request_defaults sets -1) */
  uint64_t seed;         /* sampling noise (temperature > 0, random remasking), < 2**63 */
  double top_p;          /* nucleus sampling mass in (0, 1]; 0: 1, the whole vocabulary */
  const char* const* stop; /* num_stop (<= 4) stop sequences, UTF-8: seer_result.text ends before the first */
  size_t num_stop;
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
  const char* text;                 /* UTF-8 answer (cut at a stop sequence), NULL when the tokenizer's decoder is
                                       not readable in C++ (token_ids are never cut) */
  const char* error;                /* NULL when the request was answered */
  int64_t refreshes;                /* denoising steps that computed the prompt */
} seer_result;

typedef struct {
  size_t count;
  seer_result* items;
} seer_results;

int seer_abi_version(void);
/* A request of defaults: struct_size = sizeof(seer_request), temperature -1 (the export's), every other field 0. */
static inline seer_request seer_request_defaults(void) {
  seer_request r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.temperature = -1.0;
  return r;
}
/* requests: count requests of one struct_size each, laid out at that stride */
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
