/*
 * fuzz/fuzz_targets.h - what the fuzzers run on one input (fuzz_targets.c); called by the libFuzzer
 * entry points (fuzz/fuzz_*.c, built by scripts/fuzz.sh with clang) and by the regression test
 * that replays the kept inputs of test/fuzz/ (test/test_fuzz_corpus.c, in make test).
 *
 * A target returns 0; it calls abort() when a property breaks (a crash, a sanitizer report or an
 * abort is a finding). Bad input is expected and must end in an Error, never in a crash.
 *   fuzz_config      the YAML config loader: load, resolve; a config that resolves must print as
 *                    YAML that loads back to an equal config.
 *   fuzz_idx         the Megatron .idx/.bin reader: the input is a u16 length L, then L bytes of
 *                    .idx and the rest .bin; a set that opens must read every token of every
 *                    document (of the first 64) without an error.
 *   fuzz_checkpoint  the checkpoint reader. First byte mod 3: 0 - the rest is a state.bin, read
 *                    and checked, its planner and stream sections restored; 1 - a genuine planner
 *                    and stream state (after 0-3 planned steps: the next byte mod 4) with words
 *                    overwritten by the rest (records of a u16 index and a u64 value), restored;
 *                    2 - the rest is a model.safetensors, loaded into a tiny model. A restored
 *                    planner then plans two steps.
 *   fuzz_ckpt_index  the sharded checkpoint's index.json reader (util/ckpt_index.h): the input is the
 *                    index; one that opens must keep what the reader promises (every chunk's moment
 *                    shards partition its parameters, every tensor's blocks inside it, inside their
 *                    chunk, disjoint and covering it), and reading each tensor (whose shard files
 *                    are not there) must end in an Error.
 *   fuzz_safetensors the safetensors reader (util/safetensors.h; weight files users download): the
 *                    input is the file; one that opens must keep what the reader promises (every
 *                    tensor's bytes inside the data section, the tensors filling it one after
 *                    another, sizes = shape x dtype), and every tensor is read whole. Then the same
 *                    bytes go to model_load (a tiny model) named .safetensors and .bin: the format
 *                    sniffing of engine/model/model_format.c and, for a llama2.c header, its loader.
 */
#ifndef WLB_FUZZ_FUZZ_TARGETS_H
#define WLB_FUZZ_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

int fuzz_config(const uint8_t *data, size_t size);
int fuzz_idx(const uint8_t *data, size_t size);
int fuzz_checkpoint(const uint8_t *data, size_t size);
int fuzz_ckpt_index(const uint8_t *data, size_t size);
int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_lengths(const uint8_t *data, size_t size);
int fuzz_tokenizer(const uint8_t *data, size_t size);
int fuzz_calibration(const uint8_t *data, size_t size);

#endif
