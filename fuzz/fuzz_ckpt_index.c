/* fuzz/fuzz_ckpt_index.c - libFuzzer entry point of fuzz_ckpt_index (fuzz_targets.h); built by scripts/fuzz.sh. */
#include "fuzz/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_ckpt_index(data, size); }
