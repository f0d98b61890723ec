/*
 * data/data_stream.h - the document stream: what a training run (or a dry run) reads, in order.
 *
 * Sources are data sets seen as document lengths: a Megatron set (lengths from its .idx; tokens
 * are read later, only for the documents a rank needs) or a length list. Each source is visited
 * in a seeded shuffled order, a fresh order every epoch (data_shuffle.h). Several sources are
 * blended by weight, as shares of tokens: the next document comes from the source furthest behind
 * its share. Documents longer than the context window come out as consecutive pieces of at most
 * the window, each with its offset in the document (RoPE positions continue from it). Empty
 * documents are skipped. With cut_at_windows set, pieces also end at every multiple of the window
 * in the stream's tokens (Plain-4D's loader: the stream concatenated and cut every window tokens),
 * so a document straddling such a cut comes out as two pieces.
 *
 * The position is a handful of integers per source: data_stream_save/restore give them to a
 * checkpoint, and a restored stream yields exactly what the uninterrupted one would have.
 *
 * Held-out split (data.valid_fraction): document `doc` of any source is a validation document when
 * a hash of its id alone, as a number in [0, 1), is below the fraction - the same split for every
 * seed, layout, source order and run. A stream restricted to one side skips the documents of the
 * other as it skips empty ones, so a training stream never yields a validation document.
 */
#ifndef WLB_DATA_DATA_STREAM_H
#define WLB_DATA_DATA_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "data/data_idx.h"
#include "data/data_shuffle.h"
#include "util/error.h"

typedef struct DataSource {
    const DataIdx *idx;      /* a Megatron set, or NULL */
    const uint32_t *lengths; /* else a list of document lengths */
    uint64_t n_docs;
    uint64_t n_tokens;
} DataSource;

DataSource data_source_from_idx(const DataIdx *idx);
DataSource data_source_from_lengths(const uint32_t *lengths, uint64_t n_docs, uint64_t n_tokens);
uint64_t data_source_doc_len(const DataSource *s, uint64_t doc);

/* One piece of a document, at most the context window long. */
typedef struct DataPiece {
    uint32_t source;  /* index of the source */
    uint64_t doc;     /* document id within the source */
    uint64_t doc_len; /* tokens in the whole document */
    uint64_t offset;  /* first token of the piece within the document */
    uint64_t len;     /* tokens in the piece, 1..window */
} DataPiece;

typedef struct DataStreamSource {
    DataSource src;
    double weight;       /* normalised share of tokens */
    uint64_t epoch;      /* epochs completed */
    uint64_t index;      /* next position in this epoch's order */
    uint64_t tokens;     /* tokens taken so far (for blending) */
    DataShuffle order;   /* this epoch's order */
} DataStreamSource;

/* Which documents a stream yields: all of them, or one side of the held-out split. */
typedef enum DataSplit { DATA_SPLIT_ALL, DATA_SPLIT_TRAIN, DATA_SPLIT_VALID } DataSplit;

typedef struct DataStream {
    int n_sources;
    DataStreamSource *sources;
    uint64_t seed;
    uint64_t window;
    uint64_t tokens;     /* tokens emitted in all */
    int cut_at_windows;  /* end pieces at multiples of window of tokens (set by the user, not saved) */
    DataSplit split;     /* the side of the held-out split it yields (data_stream_set_split, not saved) */
    double split_fraction;
    /* The document in progress (its remaining pieces come next), if any. */
    int has_current;
    DataPiece current;   /* the next piece to emit of the current document (offset valid) */
} DataStream;

/* weights: one per source, > 0, or NULL for equal shares. Copies the sources. */
int data_stream_init(DataStream *s, const DataSource *sources, const double *weights, int n_sources,
                     uint64_t seed, uint64_t window, Error *err);
void data_stream_free(DataStream *s);
void data_stream_next(DataStream *s, DataPiece *out);

/* 1 when document doc is a validation document of a split that holds out `fraction` (0 <= fraction
 * < 1) of the documents; data_split_keeps: when a stream on `side` yields it. */
int data_split_is_valid(uint64_t doc, double fraction);
int data_split_keeps(DataSplit side, double fraction, uint64_t doc);
/* The non-empty documents of source s on `side`, and their tokens (reads every length: O(documents)). */
void data_split_count(const DataSource *s, DataSplit side, double fraction, uint64_t *docs, uint64_t *tokens);
/* Restricts the stream to one side of the split (before the first data_stream_next). An Error (status 2)
 * when a source has no non-empty document on that side: the stream would never yield one. */
int data_stream_set_split(DataStream *s, DataSplit side, double fraction, Error *err);

/* The position as words: save writes data_stream_state_words() of them. */
size_t data_stream_state_words(const DataStream *s);
void data_stream_save(const DataStream *s, uint64_t *words);
/* Restores a position saved by a stream over the same sources, seed and window. */
int data_stream_restore(DataStream *s, const uint64_t *words, size_t n_words, Error *err);

#endif
