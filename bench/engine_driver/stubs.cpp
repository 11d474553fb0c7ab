// Link stubs: symbols referenced by the engine objects on paths these four packs never take.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizers/vocab/vocab.h"

// T5UniGramTokenizer(is_umt5 = true) only (t5_unigram_tokenizer.cpp:247-248); PixArt builds
// the plain T5 tokenizer (conditioner.hpp:1656, default is_umt5 = false).
std::string load_umt5_tokenizer_json() {
    fprintf(stderr, "ggk_tok: the UMT5 vocabulary is not compiled into this driver\n");
    abort();
}
