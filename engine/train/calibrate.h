/*
 * engine/train/calibrate.h - `wlbtrain calibrate`: measures the cost model's rates on the device of
 * train.device and writes them as a calibration profile (engine/plan/calibration.c, version 2) that
 * balance.calibration loads - the dry run and the live planner then predict with them.
 *
 * What is timed, at the config's model shapes with its TP split (one layer of one rank; a device
 * that runs ops asynchronously is synchronized around each timed block):
 *   products      the layer's four (q/k/v, output, gate/up, down), forward and both backward
 *                 products, at micro-batches of W/8, W/4, W/2 and W tokens (W = the window);
 *   element-wise  the layer's RMSNorms, RoPE, SwiGLU, forward and backward, at the same sizes;
 *   attention     forward and backward over a window of W tokens filled with documents of one length
 *                 L, for L = the kernel tile (16 at least) doubling up to W; then mixes of lengths
 *                 in one window, as the fit's check.
 * The fit (least squares, the math beside the code): seconds of the products = a_g + FLOPs / R,
 * of the element-wise work = a_e + bytes / B, with the cost model's own FLOP and byte counts per
 * token; R / peak is gemm_efficiency, B is hbm_gbps, a_g + a_e is launch_us. Attention: the rate at
 * each length is FLOPs / seconds (the forward's; the backward counted at 2.5x), the table the cost
 * model interpolates.
 */
#ifndef WLB_ENGINE_CALIBRATE_H
#define WLB_ENGINE_CALIBRATE_H

#include "config/config.h"
#include "util/error.h"

/* Measures and writes the profile to out_path (atomically; nothing is written on an error).
 * Prints what it measured on stdout. train.device without a device: an Error (status 2). */
int calibrate_run(const Config *cfg, const char *out_path, Error *err);

#endif
