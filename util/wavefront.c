/* util/wavefront.c - the wavefront order of a pipeline of stages over pieces (util/wavefront.h). */
#include "util/wavefront.h"

int wavefront_order(int n_stages, int n_pieces, int *stage, int *piece)
{
    int n = 0;
    if (n_stages <= 0 || n_pieces <= 0)
        return 0;
    int steps = n_pieces + WAVEFRONT_LAG * (n_stages - 1);
    for (int t = 0; t < steps; t++)
        for (int s = n_stages - 1; s >= 0; s--) {
            int j = t - WAVEFRONT_LAG * s;
            if (j >= 0 && j < n_pieces) {
                stage[n] = s;
                piece[n] = j;
                n++;
            }
        }
    return n;
}
