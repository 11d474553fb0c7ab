// ggk_tok: print the token ids ggk 0.9.7 feeds pig_clip (and, for PixArt, the T5 seed
// window) for a file of prompts, using the engine's own tokenizer sources unchanged:
//   core/util.cpp                       parse_prompt_attention, utf8<->utf32
//   tokenizers/tokenizer.cpp            Tokenizer::pad_tokens
//   tokenizers/bpe_tokenizer.cpp        BPETokenizer::encode / bpe
//   tokenizers/qwen2_tokenizer.cpp      Qwen2Tokenizer (vocab derived from the merges)
//   tokenizers/tokenize_util.cpp        token_split (the Qwen2 regex emulation), special-token split
//   tokenizers/t5_unigram_tokenizer.cpp T5UniGramTokenizer (PixArt seed window)
//   tokenizers/vocab_provider.cpp, hf_tokenizer_json.cpp (tokenizer-pack overrides)
//   tokenizers/vocab/{qwen_merges,t5}.hpp via vocab_min.cpp (the compiled-in vocab data)
//
// Only the prompt assembly of the conditioners (conditioning/conditioner.hpp, which
// cannot be compiled without the whole engine) is transcribed here; every step cites
// the engine line it mirrors (ggk-0.9.7/vendor/engine/diffusion/src/...).
//
// Usage: ggk_tok --version VERSION [--prompts FILE|-] [--caption-length N] [--pack-dir DIR]
//                [--verbose] [--classify]
//        ggk_tok --versions        (the model versions below, as one JSON array)
//   VERSION: the model version whose conditioner assembles the prompt (model.h's names, as ggk_cond
//            takes them): pixart (with its T5 seed window) | llada_image | mage_flow | qwen_image_2_1
//   Input: one JSON value per line: a string (the prompt), or an object
//          {"text": "...", "images": [n1, n2, ...]} where n_i is the number of vision
//          slots (<|image_pad|>) of reference image i (the edit template of mage_flow and qwen_image_2_1).
//   Output: one JSON object per input line: {"version", "text", "ids", "n", "start", ...}.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/util.h"
#include "json.hpp"
#include "tokenizers/qwen2_tokenizer.h"
#include "tokenizers/t5_unigram_tokenizer.h"
#include "tokenizers/vocab_provider.h"

// non-static helpers of tokenizers/tokenize_util.cpp (not in its header)
bool is_letter(char32_t ch);
bool is_number(char32_t ch);
bool is_space(char32_t cp);

using json = nlohmann::json;
using Chunks = std::vector<std::pair<std::string, float>>;

// ------------------------------------------------------------------ tokenizer probes
// Subclasses only to read the protected piece tables for --verbose output.
struct QwenTok : public Qwen2Tokenizer {
    QwenTok() : Qwen2Tokenizer() {}
    std::string piece(int id) const {
        auto it = decoder.find(id);
        return it == decoder.end() ? std::string("<?>") : utf32_to_utf8(it->second);
    }
    int vocab_size() const { return encoder_len; }
};

struct T5Tok : public T5UniGramTokenizer {
    T5Tok() : T5UniGramTokenizer(false) {}
    std::string piece(int id) const {
        if (id < 0 || id >= static_cast<int>(piece_score_pairs.size())) return "<?>";
        return piece_score_pairs[id].first;
    }
    int status_code() const { return static_cast<int>(status()); }
    size_t n_pieces() const { return piece_score_pairs.size(); }
};

static bool g_verbose = false;

static json pieces_of(const QwenTok& tok, const std::vector<int>& ids) {
    json a = json::array();
    for (int id : ids) a.push_back(tok.piece(id));
    return a;
}

static json chunks_json(const Chunks& chunks) {
    json a = json::array();
    for (const auto& c : chunks) a.push_back(json::array({c.first, c.second}));
    return a;
}

static bool all_one(const std::vector<float>& w) {
    for (float x : w)
        if (x != 1.0f) return false;
    return true;
}

// ------------------------------------------------------------------ LLMEmbedder::tokenize
// conditioner.hpp:2551-2619 (spell_quotes is false and suffix empty for these versions:
// conditioner.hpp:2941, 2943; only longcat sets spell_quotes, 3307; only iris a suffix, 3673).
struct Tokenized {
    Chunks chunks;
    std::vector<int> tokens;
    std::vector<float> weights;
    std::vector<float> mask;
};

static Tokenized llm_tokenize(QwenTok& tok, const std::string& text, const std::pair<int, int>& attn_range,
                              size_t min_length, size_t max_length) {
    Tokenized r;
    Chunks& parsed_attention = r.chunks;
    if (attn_range.first >= 0 && attn_range.second > 0) {                       // :2558
        if (attn_range.first > 0) {                                              // :2559
            parsed_attention.emplace_back(text.substr(0, attn_range.first), 1.f);
        }
        if (attn_range.second - attn_range.first > 0) {                          // :2562
            auto new_parsed_attention = parse_prompt_attention(
                text.substr(attn_range.first, attn_range.second - attn_range.first));
            parsed_attention.insert(parsed_attention.end(), new_parsed_attention.begin(), new_parsed_attention.end());
        }
        if (attn_range.second < static_cast<int>(text.size())) {                 // :2571
            parsed_attention.emplace_back(text.substr(attn_range.second), 1.f);
        }
    } else {
        parsed_attention.emplace_back(text, 1.f);                                // :2575
    }
    for (const auto& item : parsed_attention) {                                  // :2590-2596
        std::vector<int> curr_tokens = tok.encode(item.first, nullptr);
        r.tokens.insert(r.tokens.end(), curr_tokens.begin(), curr_tokens.end());
        r.weights.insert(r.weights.end(), curr_tokens.size(), item.second);
    }
    tok.pad_tokens(r.tokens, &r.weights, &r.mask, min_length, max_length);       // :2615
    return r;
}

// ------------------------------------------------------------------ the model versions' prompts

static const char* kMageEditSystem =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n";                               // conditioner.hpp:3214
static const char* kMageT2ISystem =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";  // conditioner.hpp:3225
static const char* kQwenSuffix = "<|im_end|>\n<|im_start|>assistant\n";
static const char* kQI21System = "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n";  // :3080

// the model versions whose prompt assembly this driver transcribes
static const std::vector<std::string> kVersions = {"pixart", "llada_image", "mage_flow", "qwen_image_2_1"};

static json run_llm_version(const std::string& version, QwenTok& tok, const std::string& user_text,
                            const std::vector<int>& images) {
    std::string prompt;
    std::pair<int, int> prompt_attn_range{0, 0};
    int start_idx     = 34;          // conditioner.hpp:2937
    size_t min_length = 0;           // :2938
    size_t max_length = 100000000;   // :2939
    std::vector<std::pair<int, int>> image_slots;  // (first <|image_pad|> index, count)
    json out;

    if (version == "llada_image") {                                              // conditioner.hpp:3443-3464
        if (!images.empty()) out["note"] = "llada_image: reference images never enter the text encoder (ignored)";
        start_idx = 0;
        if (user_text.empty()) {
            prompt            = "<role>HUMAN</role> Generate an image.";
            prompt_attn_range = {0, 0};
        } else {
            prompt                   = "<role>HUMAN</role> Generate an image:";
            prompt_attn_range.first  = static_cast<int>(prompt.size());
            prompt += " " + user_text;
            prompt_attn_range.second = static_cast<int>(prompt.size());
        }
        prompt += "\n<role>ASSISTANT</role>\n<IMAGE1>";
    } else if (version == "mage_flow") {                                         // conditioner.hpp:3154-3235
        if (!images.empty()) {
            start_idx           = 64;
            int image_embed_idx = 64 + 6;
            std::string img_prompt;
            for (size_t i = 0; i < images.size(); i++) {
                int n = images[i];
                image_slots.emplace_back(image_embed_idx, n);
                image_embed_idx += 1 + n + 6;                                    // :3203
                img_prompt += "Image " + std::to_string(i + 1) + ": <|vision_start|>";
                for (int j = 0; j < n; j++) img_prompt += "<|image_pad|>";
                img_prompt += "<|vision_end|>";
            }
            prompt = kMageEditSystem;
            prompt += img_prompt;
            prompt_attn_range.first = static_cast<int>(prompt.size());
            prompt += user_text;
            prompt_attn_range.second = static_cast<int>(prompt.size());
            prompt += kQwenSuffix;
        } else {
            start_idx = 34;
            prompt    = kMageT2ISystem;
            prompt_attn_range.first = static_cast<int>(prompt.size());
            prompt += user_text;
            prompt_attn_range.second = static_cast<int>(prompt.size());
            prompt += kQwenSuffix;
        }
        max_length = 2048 + start_idx;                                           // :3233-3235
    } else if (version == "qwen_image_2_1") {                                    // conditioner.hpp:3050-3153
        prompt    = kQI21System;
        start_idx = static_cast<int>(tok.encode(prompt, nullptr).size());        // :3082
        prompt += "<|im_start|>user\n";
        for (size_t i = 0; i < images.size(); ++i) {
            prompt += (i == 0 ? "" : " ") + std::string("<image") + std::to_string(i + 1) + "><|vision_start|>";
            int index = static_cast<int>(tok.encode(prompt, nullptr).size());    // :3129
            int count = images[i];
            image_slots.emplace_back(index, count);
            for (int j = 0; j < count; ++j) prompt += "<|image_pad|>";
            prompt += "<|vision_end|>";
        }
        prompt_attn_range.first = static_cast<int>(prompt.size());
        prompt += user_text.empty() ? " " : user_text;                           // :3151
        prompt_attn_range.second = static_cast<int>(prompt.size());
        prompt += kQwenSuffix;
    }

    Tokenized t = llm_tokenize(tok, prompt, prompt_attn_range, min_length, max_length);

    std::vector<std::string> errors;
    // conditioner.hpp:2687: the vision slots must fit the (possibly truncated) sequence
    for (const auto& s : image_slots) {
        if (s.first + s.second > static_cast<int>(t.tokens.size()))
            errors.push_back("GGML_ASSERT(idx + n <= tokens.size()) fails: image slots past the truncated sequence");
        else {
            for (int j = 0; j < s.second; ++j)
                if (t.tokens[s.first + j] != 151655) {
                    errors.push_back("slot position does not hold <|image_pad|> (engine would splice at the wrong place)");
                    break;
                }
        }
    }
    // conditioner.hpp:2898 (GGML_ASSERT(rows > start)); apply_token_weights :95 (called at :2897) for LLaDA
    if (static_cast<int>(t.tokens.size()) <= start_idx)
        errors.push_back("GGML_ASSERT(hidden_states.shape()[1] > prompt_template_encode_start_idx) fails");
    if (version == "llada_image" && !all_one(t.weights) && t.tokens.size() != 256)
        errors.push_back("apply_token_weights: GGML_ASSERT(256 adapter rows == " + std::to_string(t.tokens.size()) +
                         " token weights) fails (weighted prompt on the LLaDA resampler path)");

    out["ids"]   = t.tokens;
    out["n"]     = t.tokens.size();
    out["start"] = start_idx;
    if (!image_slots.empty()) {
        json s = json::array();
        for (const auto& p : image_slots) s.push_back(json::array({p.first, p.second}));
        out["image_slots"] = s;
    }
    if (!all_one(t.weights)) out["weights"] = t.weights;
    if (!errors.empty()) out["engine_error"] = errors;
    if (g_verbose) {
        out["chunks"] = chunks_json(t.chunks);
        out["pieces"] = pieces_of(tok, t.tokens);
    }
    return out;
}

// PixArtT5Embedder (conditioner.hpp:1655-1891), the --llm + --llm-adapter path.
static json run_pixart(QwenTok& qtok, T5Tok& t5, const std::string& text, size_t caption_length) {
    json out;
    auto parsed_attention = parse_prompt_attention(text);                        // :1812

    // student: compute_qwen_hidden (:1781-1789): Qwen BPE of each chunk, concatenated
    std::vector<int> qwen_tokens;
    for (const auto& item : parsed_attention) {
        std::vector<int> curr_tokens = qtok.tokenize(item.first, nullptr);
        qwen_tokens.insert(qwen_tokens.end(), curr_tokens.begin(), curr_tokens.end());
    }
    if (qwen_tokens.empty()) qwen_tokens.push_back(151643);                      // :1787-1789

    // T5 window (:1814-1823)
    std::vector<int> tokens;
    std::vector<float> weights;
    json t5_chunk_pieces = json::array();
    for (const auto& item : parsed_attention) {
        std::vector<int> chunk = t5.encode(item.first);
        tokens.insert(tokens.end(), chunk.begin(), chunk.end());
        weights.insert(weights.end(), chunk.size(), item.second);
    }
    std::vector<float> mask;
    t5.pad_tokens(tokens, &weights, &mask, caption_length, caption_length, false);
    size_t real = 0;
    for (float m : mask) real += m > 0.0f ? 1 : 0;

    out["ids"]    = qwen_tokens;
    out["n"]      = qwen_tokens.size();
    out["start"]  = 0;
    out["t5_ids"] = tokens;
    out["t5_len"] = real;
    if (!all_one(weights)) out["t5_weights"] = weights;
    if (g_verbose) {
        out["chunks"] = chunks_json(parsed_attention);
        out["pieces"] = pieces_of(qtok, qwen_tokens);
        json tp = json::array();
        for (size_t i = 0; i < real; ++i) tp.push_back(t5.piece(tokens[i]));
        out["t5_pieces"] = tp;
    }
    return out;
}

// ------------------------------------------------------------------ --classify
// For every code point the Qwen2 pre-tokenizer classifies differently from the Unicode
// classes the HF regex uses, the driver can't know the HF class, so it prints the engine's
// view: letter (is_letter), number (is_number), space (is_space), cspace (C isspace() of the
// code point as this build's C library answers it), for the code points given on stdin
// (one hex number per line), or with no input for every code point > 0xFF that is neither
// letter nor number but for which isspace() is true (the ones the engine drops).
static int classify() {
    std::string line;
    bool any = false;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        any         = true;
        char32_t cp = static_cast<char32_t>(std::strtoul(line.c_str(), nullptr, 16));
        json o;
        o["cp"]     = line;
        o["letter"] = is_letter(cp);
        o["number"] = is_number(cp);
        o["space"]  = is_space(cp);
        o["cspace"] = isspace(cp) != 0;
        std::cout << o.dump() << "\n";
    }
    if (!any) {
        for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
            if (!is_letter(cp) && !is_number(cp) && !is_space(cp) && isspace(cp)) {
                printf("%04X\n", static_cast<unsigned>(cp));
            }
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    std::string version, prompts_path = "-", pack_dir;
    size_t caption_length = 120;
    bool do_classify      = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next     = [&]() -> std::string {
            if (i + 1 >= argc) {
                fprintf(stderr, "missing value for %s\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--version") version = next();
        else if (a == "--versions") {
            std::cout << json(kVersions).dump() << "\n";
            return 0;
        }
        else if (a == "--prompts") prompts_path = next();
        else if (a == "--caption-length") caption_length = std::stoul(next());
        else if (a == "--pack-dir") pack_dir = next();
        else if (a == "--verbose" || a == "-v") g_verbose = true;
        else if (a == "--classify") do_classify = true;
        else {
            fprintf(stderr,
                    "usage: %s --version pixart|llada_image|mage_flow|qwen_image_2_1 "
                    "[--prompts FILE|-] [--caption-length 120] [--pack-dir DIR] [--verbose]\n"
                    "       %s --classify < hex code points\n",
                    argv[0], argv[0]);
            return 2;
        }
    }
    if (do_classify) return classify();
    if (std::find(kVersions.begin(), kVersions.end(), version) == kVersions.end()) {
        fprintf(stderr, "--version must be one of pixart, llada_image, mage_flow, qwen_image_2_1\n");
        return 2;
    }
    // gk-diffuser.cpp:1033-1037: --tokenizer-pack / SD_TOKENIZER_PACK, set before tokenizers are built
    if (!pack_dir.empty()) VocabProvider::instance().set_pack_dir(pack_dir);

    QwenTok qtok;
    std::unique_ptr<T5Tok> t5;
    if (version == "pixart") {
        t5.reset(new T5Tok());
        if (t5->status_code() != 0) {
            fprintf(stderr, "T5 tokenizer failed to initialise (status %d)\n", t5->status_code());
            return 1;
        }
    }

    std::istream* in = &std::cin;
    std::ifstream f;
    if (prompts_path != "-") {
        f.open(prompts_path, std::ios::binary);
        if (!f) {
            fprintf(stderr, "cannot open %s\n", prompts_path.c_str());
            return 1;
        }
        in = &f;
    }
    std::string line;
    int lineno = 0;
    while (std::getline(*in, line)) {
        ++lineno;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        json out;
        out["version"] = version;
        try {
            json v = json::parse(line);
            std::string text;
            std::vector<int> images;
            if (v.is_string()) {
                text = v.get<std::string>();
            } else if (v.is_object()) {
                text = v.value("text", std::string());
                if (v.contains("images")) images = v["images"].get<std::vector<int>>();
            } else {
                throw std::runtime_error("expected a JSON string or object");
            }
            out["text"] = text;
            if (!images.empty()) out["images"] = images;
            json r = version == "pixart" ? run_pixart(qtok, *t5, text, caption_length)
                                         : run_llm_version(version, qtok, text, images);
            out.update(r);
        } catch (const json::exception& e) {
            out["line"]  = lineno;
            out["error"] = std::string("bad input line: ") + e.what();
        } catch (const std::exception& e) {
            // e.g. std::stof in parse_prompt_attention (core/util.cpp:872) on "(x:.)":
            // uncaught in the engine, so the engine process terminates.
            out["line"]         = lineno;
            out["engine_error"] = std::string("uncaught C++ exception in the engine (process aborts): ") + e.what();
        }
        std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    return 0;
}
