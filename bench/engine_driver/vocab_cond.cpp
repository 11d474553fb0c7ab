// The rest of the vocabulary accessors of tokenizers/vocab/vocab.h for ggk_cond (ggk-0.9.7
// vendor/engine/diffusion/src/tokenizers/vocab/vocab.cpp): the Qwen2 merges and the T5 tokenizer.json
// these packs' conditioners read come from vocab_min.cpp (the engine's logic: the VocabProvider's
// tokenizer pack or override first, then the compiled-in data); every other family aborts naming
// itself. Compiling only those two vocabulary headers instead of all ~240 MB of them keeps the build
// to minutes.
#include <cstdio>
#include <cstdlib>

#include "tokenizers/vocab/vocab.h"

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
