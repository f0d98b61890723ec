/* data/data_stream.c - shuffled, blended, window-cut document stream (see data_stream.h). */
#include "data/data_stream.h"

#include <stdlib.h>
#include <string.h>

#include "util/rng.h"

DataSource data_source_from_idx(const DataIdx *idx)
{
    return (DataSource){idx, NULL, idx->n_docs, idx->n_tokens};
}

DataSource data_source_from_lengths(const uint32_t *lengths, uint64_t n_docs, uint64_t n_tokens)
{
    return (DataSource){NULL, lengths, n_docs, n_tokens};
}

uint64_t data_source_doc_len(const DataSource *s, uint64_t doc)
{
    return s->idx ? data_idx_doc_len(s->idx, doc) : s->lengths[doc];
}

/* Each (source, epoch) has its own order: the seed mixes both. */
static void start_epoch(DataStream *s, int i)
{
    DataStreamSource *ss = &s->sources[i];
    data_shuffle_init(&ss->order, ss->src.n_docs, rng_hash3(s->seed, (uint64_t)i, ss->epoch));
}

int data_stream_init(DataStream *s, const DataSource *sources, const double *weights, int n_sources,
                     uint64_t seed, uint64_t window, Error *err)
{
    memset(s, 0, sizeof *s);
    if (n_sources <= 0)
        return error_set(err, "data", "no data sources");
    if (window == 0)
        return error_set(err, "data", "context window is 0");
    s->sources = calloc((size_t)n_sources, sizeof *s->sources);
    if (!s->sources)
        return error_runtime(err, "data", "out of memory");
    s->n_sources = n_sources;
    s->seed = seed;
    s->window = window;
    double total = 0;
    for (int i = 0; i < n_sources; i++) {
        if (sources[i].n_tokens == 0) {
            data_stream_free(s);
            return error_set(err, "data", "data source %d has no tokens", i + 1);
        }
        s->sources[i].src = sources[i];
        s->sources[i].weight = weights ? weights[i] : 1.0;
        total += s->sources[i].weight;
        start_epoch(s, i);
    }
    for (int i = 0; i < n_sources; i++)
        s->sources[i].weight /= total;
    return 0;
}

void data_stream_free(DataStream *s)
{
    free(s->sources);
    memset(s, 0, sizeof *s);
}

/* The source furthest behind its share of the tokens emitted so far (lowest index on ties). */
static int pick_source(const DataStream *s)
{
    int best = 0;
    double best_deficit = 0;
    for (int i = 0; i < s->n_sources; i++) {
        const DataStreamSource *ss = &s->sources[i];
        double deficit = ss->weight * (double)(s->tokens + 1) - (double)ss->tokens;
        if (i == 0 || deficit > best_deficit) {
            best = i;
            best_deficit = deficit;
        }
    }
    return best;
}

/* The split's hash of a document id: a SplitMix64 mix under a constant of its own ("VALID"), as a
 * number in [0, 1) with 53 bits. No seed: the split is a property of the data set. */
static double split_point(uint64_t doc)
{
    return (double)(rng_hash3(0x56414c4944ull, doc, 0) >> 11) * 0x1.0p-53;
}

int data_split_is_valid(uint64_t doc, double fraction)
{
    return fraction > 0 && split_point(doc) < fraction;
}

int data_split_keeps(DataSplit side, double fraction, uint64_t doc)
{
    if (side == DATA_SPLIT_ALL)
        return 1;
    return data_split_is_valid(doc, fraction) == (side == DATA_SPLIT_VALID);
}

void data_split_count(const DataSource *s, DataSplit side, double fraction, uint64_t *docs, uint64_t *tokens)
{
    *docs = *tokens = 0;
    for (uint64_t d = 0; d < s->n_docs; d++) {
        uint64_t len = data_source_doc_len(s, d);
        if (len > 0 && data_split_keeps(side, fraction, d)) {
            ++*docs;
            *tokens += len;
        }
    }
}

int data_stream_set_split(DataStream *s, DataSplit side, double fraction, Error *err)
{
    if (!(fraction >= 0 && fraction < 1))
        return error_set(err, "data.valid_fraction", "must be in [0, 1), got %g", fraction);
    for (int i = 0; i < s->n_sources && side != DATA_SPLIT_ALL; i++) {
        const DataSource *src = &s->sources[i].src;
        uint64_t d = 0;
        while (d < src->n_docs && !(data_source_doc_len(src, d) > 0 && data_split_keeps(side, fraction, d)))
            d++;
        if (d == src->n_docs)
            return error_set(err, "data.valid_fraction", "%g leaves data source %d (%llu documents) no %s document",
                             fraction, i + 1, (unsigned long long)src->n_docs,
                             side == DATA_SPLIT_VALID ? "validation" : "training");
    }
    s->split = side;
    s->split_fraction = fraction;
    return 0;
}

/* Starts the next non-empty document of source i on the stream's side of the split (sources have
 * such documents, so one exists). */
static void start_document(DataStream *s, int i)
{
    DataStreamSource *ss = &s->sources[i];
    for (;;) {
        uint64_t doc = data_shuffle_at(&ss->order, ss->index);
        if (++ss->index == ss->src.n_docs) {
            ss->index = 0;
            ss->epoch++;
            start_epoch(s, i);
        }
        uint64_t len = data_source_doc_len(&ss->src, doc);
        if (len > 0 && data_split_keeps(s->split, s->split_fraction, doc)) {
            s->current = (DataPiece){(uint32_t)i, doc, len, 0, 0};
            s->has_current = 1;
            return;
        }
    }
}

void data_stream_next(DataStream *s, DataPiece *out)
{
    if (!s->has_current)
        start_document(s, pick_source(s));
    DataPiece *c = &s->current;
    uint64_t left = c->doc_len - c->offset;
    *out = *c;
    /* room: tokens to the end of the window, of the document's own (offset 0, W, 2W, ...) or, when
     * cutting at the stream's windows, of the stream's (tokens 0, W, 2W, ... emitted in all). */
    uint64_t room = s->cut_at_windows ? s->window - s->tokens % s->window : s->window;
    out->len = left < room ? left : room;
    c->offset += out->len;
    s->has_current = c->offset < c->doc_len;
    s->tokens += out->len;
    s->sources[out->source].tokens += out->len;
}

/* Layout: tokens, has_current, current.{source, doc, offset}, then per source epoch, index, tokens. */
enum { STATE_HEADER = 5, STATE_PER_SOURCE = 3 };

size_t data_stream_state_words(const DataStream *s)
{
    return STATE_HEADER + STATE_PER_SOURCE * (size_t)s->n_sources;
}

void data_stream_save(const DataStream *s, uint64_t *w)
{
    w[0] = s->tokens;
    w[1] = (uint64_t)s->has_current;
    w[2] = s->current.source;
    w[3] = s->current.doc;
    w[4] = s->current.offset;
    for (int i = 0; i < s->n_sources; i++) {
        const DataStreamSource *ss = &s->sources[i];
        uint64_t *p = w + STATE_HEADER + STATE_PER_SOURCE * (size_t)i;
        p[0] = ss->epoch;
        p[1] = ss->index;
        p[2] = ss->tokens;
    }
}

int data_stream_restore(DataStream *s, const uint64_t *w, size_t n_words, Error *err)
{
    if (n_words != data_stream_state_words(s))
        return error_set(err, "data stream", "saved position has %zu words, this stream needs %zu (the data "
                         "sources differ)", n_words, data_stream_state_words(s));
    for (int i = 0; i < s->n_sources; i++) {
        const uint64_t *p = w + STATE_HEADER + STATE_PER_SOURCE * (size_t)i;
        if (p[1] >= s->sources[i].src.n_docs)
            return error_set(err, "data stream", "saved position %llu is past the %llu documents of source %d",
                             (unsigned long long)p[1], (unsigned long long)s->sources[i].src.n_docs, i + 1);
    }
    if (w[1] > 1 || (w[1] && (w[2] >= (uint64_t)s->n_sources || w[3] >= s->sources[w[2]].src.n_docs)))
        return error_set(err, "data stream", "saved position names a document that does not exist");
    uint64_t len = w[1] ? data_source_doc_len(&s->sources[w[2]].src, w[3]) : 0;
    if (w[1] && w[4] >= len)
        return error_set(err, "data stream", "saved offset %llu is past the end of its document (%llu tokens)",
                         (unsigned long long)w[4], (unsigned long long)len);
    s->tokens = w[0];
    s->has_current = (int)w[1];
    s->current = (DataPiece){(uint32_t)w[2], w[3], len, w[4], 0};
    for (int i = 0; i < s->n_sources; i++) {
        const uint64_t *p = w + STATE_HEADER + STATE_PER_SOURCE * (size_t)i;
        s->sources[i].epoch = p[0];
        s->sources[i].index = p[1];
        s->sources[i].tokens = p[2];
        start_epoch(s, i);
    }
    return 0;
}
