/*
 * engine/model/model_rope.c - the RoPE table: the head_dim / 2 rotation frequencies and the factor
 * cos and sin are multiplied by, for every model.rope_scaling (Hugging Face's rope types, the
 * formulas of transformers' modeling_rope_utils: _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_llama3_parameters, _compute_yarn_parameters).
 *
 * With theta the base, d = head_dim, f_i = theta^(-2i/d) for i < d/2, lambda_i = 2 pi / f_i its
 * wavelength in positions, s = rope_scaling_factor, L = rope_original_max_seq_len:
 *   none    f'_i = f_i
 *   linear  f'_i = f_i / s (position interpolation)
 *   llama3  (Llama 3.1) with alpha = low_freq_factor, beta = high_freq_factor:
 *             lambda_i < L / beta: f_i;  lambda_i > L / alpha: f_i / s;
 *             between: gamma = (L / lambda_i - alpha) / (beta - alpha), (1 - gamma) f_i / s + gamma f_i
 *   yarn    c(r) = d ln(L / (2 pi r)) / (2 ln theta), the dimension that turns r times over L;
 *           lo = max(floor(c(beta_fast)), 0), hi = min(ceil(c(beta_slow)), d - 1) (no floor and ceil
 *           with rope_yarn_truncate false; hi += 0.001 when equal); ramp_i = clamp((i - lo) / (hi - lo),
 *           0, 1); f'_i = (f_i / s) ramp_i + f_i (1 - ramp_i); and cos, sin multiplied by
 *           rope_attention_factor, or 0.1 ln s + 1 when that is 0 (1 for s <= 1).
 * Everything is computed in double and each frequency rounded once to float32 (Hugging Face computes
 * in float32: its frequencies are within an ulp or two of these).
 */
#include <math.h>

#include "engine/model/model.h"

float model_rope_table(const ConfigModel *c, int head_dim, float *inv_freq)
{
    double s = c->rope_scaling_factor, L = (double)c->rope_original_max_seq_len, d = head_dim;
    double lo = 0, hi = 1;
    if (c->rope_scaling == ROPE_SCALING_YARN) {
        double c_fast = d * log(L / (c->rope_yarn_beta_fast * 2 * M_PI)) / (2 * log(c->rope_theta));
        double c_slow = d * log(L / (c->rope_yarn_beta_slow * 2 * M_PI)) / (2 * log(c->rope_theta));
        if (c->rope_yarn_truncate) {
            c_fast = floor(c_fast);
            c_slow = ceil(c_slow);
        }
        lo = c_fast > 0 ? c_fast : 0;
        hi = c_slow < d - 1 ? c_slow : d - 1;
        if (lo == hi)
            hi += 0.001; /* as Hugging Face: no division by zero */
    }
    for (int i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, 2.0 * i / d);
        if (c->rope_scaling == ROPE_SCALING_LINEAR) {
            f /= s;
        } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            double wavelen = 2 * M_PI / f;
            double low_wl = L / c->rope_low_freq_factor, high_wl = L / c->rope_high_freq_factor;
            if (wavelen > low_wl) {
                f /= s;
            } else if (wavelen >= high_wl) {
                double smooth = (L / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / s + smooth * f;
            }
        } else if (c->rope_scaling == ROPE_SCALING_YARN) {
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            f = f / s * ramp + f * (1 - ramp);
        }
        inv_freq[i] = (float)f;
    }
    if (c->rope_scaling != ROPE_SCALING_YARN)
        return 1.0f;
    if (c->rope_attention_factor > 0)
        return (float)c->rope_attention_factor;
    return s <= 1 ? 1.0f : (float)(0.1 * log(s) + 1.0);
}
