/* engine/comm/layout.c - the rank layout (see layout.h). */
#include "engine/comm/layout.h"

Layout layout_of(int tp, int cp, int pp, int dp, int rank)
{
    Layout l = {tp, cp, pp, dp, rank, 0, 0, 0, 0};
    l.tp_rank = rank % tp;
    l.cp_rank = rank / tp % cp;
    l.pp_rank = rank / (tp * cp) % pp;
    l.dp_rank = rank / (tp * cp * pp);
    return l;
}

int layout_world(const Layout *l) { return l->tp * l->cp * l->pp * l->dp; }

int layout_rank_at(const Layout *l, int t, int c, int p, int d)
{
    return t + l->tp * (c + l->cp * (p + l->pp * d));
}

int layout_group(const Layout *l, LayoutGroup g, int *m)
{
    int n = 0;
    switch (g) {
    case GROUP_TP:
        for (int t = 0; t < l->tp; t++)
            m[n++] = layout_rank_at(l, t, l->cp_rank, l->pp_rank, l->dp_rank);
        break;
    case GROUP_CP:
        for (int c = 0; c < l->cp; c++)
            m[n++] = layout_rank_at(l, l->tp_rank, c, l->pp_rank, l->dp_rank);
        break;
    case GROUP_PP:
        for (int p = 0; p < l->pp; p++)
            m[n++] = layout_rank_at(l, l->tp_rank, l->cp_rank, p, l->dp_rank);
        break;
    case GROUP_DP:
        for (int d = 0; d < l->dp; d++)
            m[n++] = layout_rank_at(l, l->tp_rank, l->cp_rank, l->pp_rank, d);
        break;
    case GROUP_DPCP:
        for (int d = 0; d < l->dp; d++)
            for (int c = 0; c < l->cp; c++)
                m[n++] = layout_rank_at(l, l->tp_rank, c, l->pp_rank, d);
        break;
    case GROUP_WORLD:
        for (int r = 0; r < layout_world(l); r++)
            m[n++] = r;
        break;
    default: {
        int s = layout_cp_block_size(g), first = l->cp_rank / s * s;
        for (int c = first; c < first + s && c < l->cp; c++)
            m[n++] = layout_rank_at(l, l->tp_rank, c, l->pp_rank, l->dp_rank);
        break;
    }
    }
    return n;
}

int layout_cp_block_size(LayoutGroup g)
{
    return g >= GROUP_CP_BLOCK ? 2 << (g - GROUP_CP_BLOCK) : 1;
}

LayoutGroup layout_cp_block(const Layout *l, int size)
{
    if (size >= l->cp)
        return GROUP_CP;
    int k = 0;
    while ((2 << k) < size)
        k++;
    return (LayoutGroup)(GROUP_CP_BLOCK + k);
}

int layout_group_rank(const Layout *l, LayoutGroup g)
{
    switch (g) {
    case GROUP_TP:
        return l->tp_rank;
    case GROUP_CP:
        return l->cp_rank;
    case GROUP_PP:
        return l->pp_rank;
    case GROUP_DP:
        return l->dp_rank;
    case GROUP_DPCP:
        return l->dp_rank * l->cp + l->cp_rank;
    case GROUP_WORLD:
        return l->rank;
    default:
        return l->cp_rank % layout_cp_block_size(g);
    }
}
