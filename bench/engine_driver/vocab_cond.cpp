// The vocabulary accessors of tokenizers/vocab/vocab.h for ggk_cond (ggk-0.9.7
// vendor/engine/diffusion/src/tokenizers/vocab/vocab.cpp): the Qwen2 merges and the T5
// tokenizer.json these packs' conditioners read, with the engine's logic (the VocabProvider's
// tokenizer pack or override first, then the compiled-in data; vocab.cpp:29-35, 53-59), and
// for every other family an abort naming it. Compiling only these two headers instead of all
// ~240 MB of them keeps the build to minutes.
#include <cstdio>
#include <cstdlib>

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

[[noreturn]] static void not_compiled(const char* family) {
    fprintf(stderr, "ggk_cond: the %s vocabulary is not compiled into this driver\n", family);
    abort();
}

std::string load_clip_merges() { not_compiled("CLIP"); }
std::string load_mistral_merges() { not_compiled("Mistral"); }
std::string load_mistral_vocab_json() { not_compiled("Mistral"); }
std::string load_umt5_tokenizer_json() { not_compiled("UMT5"); }
std::string load_gemma_merges() { not_compiled("Gemma"); }
std::string load_gemma_vocab_json() { not_compiled("Gemma"); }
std::string load_gemma2_merges() { not_compiled("Gemma 2"); }
std::string load_gemma2_vocab_json() { not_compiled("Gemma 2"); }
std::string load_gpt_oss_merges() { not_compiled("gpt-oss"); }
std::string load_gpt_oss_vocab_json() { not_compiled("gpt-oss"); }
