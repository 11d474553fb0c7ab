// Minimal stand-in for the engine's tokenizers/vocab/vocab.cpp: the same two accessors
// the Qwen2 BPE and T5 unigram tokenizers call, with the same logic (VocabProvider
// first, then the compiled-in engine data), compiling only the two vocab headers the
// four pig_clip packs need instead of all ~240 MB of them.
// Source: ggk-0.9.7/vendor/engine/diffusion/src/tokenizers/vocab/vocab.cpp:29-35, 53-59.
#include "tokenizers/vocab/vocab.h"

#include "tokenizers/vocab_provider.h"

#include "tokenizers/vocab/qwen_merges.hpp"
#include "tokenizers/vocab/t5.hpp"

std::string load_qwen2_merges() {
    std::string data;
    if (VocabProvider::instance().try_load("qwen2.merges", data)) {
        return data;
    }
    return std::string(reinterpret_cast<const char*>(qwen2_merges_utf8_c_str), sizeof(qwen2_merges_utf8_c_str));
}

std::string load_t5_tokenizer_json() {
    std::string data;
    if (VocabProvider::instance().try_load("t5.tokenizer_json", data)) {
        return data;
    }
    return std::string(reinterpret_cast<const char*>(t5_tokenizer_json_str), sizeof(t5_tokenizer_json_str));
}
