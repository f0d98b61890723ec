/*
 * engine/plan/calibration.h - the cost-model calibration file (balance.calibration): a hardware
 * profile measured on the device, JSON.
 *
 * Version 2 is what `wlbtrain calibrate` writes (engine/train/train_calibrate.c); version 1 is the
 * older hand-written subset (no launch_us, no backend: everything optional). Fields:
 *   {
 *     "format": "wlbtrain-calibration", "version": 2,          (both required)
 *     "device": "NVIDIA H100 80GB HBM3",  "backend": "cuda",   (backend cpu|cuda: required in v2)
 *     "precision": "bf16", "measured": "2026-11-23T15:00:00Z", (informational)
 *     "model": {"d_model": 4096, ...},                         (the shapes it was measured at; informational)
 *     "peak_tflops": 989, "gemm_efficiency": 0.78,             (GEMM rate = peak x efficiency)
 *     "hbm_gbps": 3350,            (the element-wise rate: the cost model's bytes per token / this)
 *     "launch_us": 40,             (fixed microseconds per layer per micro-batch, forward + backward)
 *     "intra_node_gbps": 370, "inter_node_gbps": 45, "link_latency_us": 15, "gpus_per_node": 8,
 *     "attention": {               (required in v2)
 *       "tile": 128,
 *       "q":          [128, 256, 512, 1024, 2048, 4096, 8192, 16384],
 *       "fwd_tflops": [...],  "bwd_tflops": [...]     (measured at each query length, causal;
 *                                                     bwd counts 2.5x the forward's FLOPs)
 *     },
 *     "check": {"mixes": 8, "attn_r2": 0.99, "attn_max_rel_err": 0.03}  (the fit's own check; informational)
 *   }
 * Each number replaces the hardware profile's (explicit balance.* keys still win). The attention
 * table replaces the efficiency curve: the rate at a query length is interpolated linearly in
 * log2(length) and clamped at the ends. Checked on load: the format and version, no unknown key,
 * every number in its range (efficiency in (0, 1], tile and gpus_per_node whole numbers, rates
 * positive, launch_us >= 0, q increasing, the three arrays of one length); any fault is one error
 * (status 2) naming the file.
 */
#ifndef WLB_ENGINE_CALIBRATION_H
#define WLB_ENGINE_CALIBRATION_H

#include "engine/plan/cost.h"

enum { CALIBRATION_VERSION = 2 };

int calibration_load(const char *path, CostHardware *hw, CostAttnTable *table, Error *err);

#endif
