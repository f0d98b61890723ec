/* fuzz/fuzz_tokenizer.c - libFuzzer entry point of fuzz_tokenizer (fuzz_targets.h); built by scripts/fuzz.sh. */
#include "fuzz/fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenizer(data, size); }
