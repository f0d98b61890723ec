/*
 * engine/plan/calibration.h - the cost-model calibration file (balance.calibration).
 *
 * JSON, written by hand from measurements on the real hardware (a `calibrate` command is planned);
 * every field but the first two is optional and replaces the hardware profile's value:
 *   {
 *     "format": "wlbtrain-calibration", "version": 1,
 *     "device": "NVIDIA H100 80GB HBM3",
 *     "peak_tflops": 989, "gemm_efficiency": 0.78,
 *     "hbm_gbps": 3350, "intra_node_gbps": 370, "inter_node_gbps": 45, "link_latency_us": 15,
 *     "gpus_per_node": 8,
 *     "attention": {
 *       "tile": 128,
 *       "q":          [128, 256, 512, 1024, 2048, 4096, 8192, 16384],
 *       "fwd_tflops": [...],  "bwd_tflops": [...]     (measured at each query length, causal)
 *     }
 *   }
 * The attention table replaces the efficiency curve: the rate at a query length is interpolated
 * linearly in log2(length) and clamped at the ends.
 */
#ifndef WLB_ENGINE_CALIBRATION_H
#define WLB_ENGINE_CALIBRATION_H

#include "engine/plan/cost.h"

int calibration_load(const char *path, CostHardware *hw, CostAttnTable *table, Error *err);

#endif
