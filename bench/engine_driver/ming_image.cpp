// ggk_ming: the Ming-Image facts ggk 0.9.7 computes without a model, from the engine's own code.
//
// The engine functions are not rewritten here: bench/engine_ming_fixture.py cuts them out of the
// unpacked sdist unchanged (brace-matched, with #line directives pointing back at the engine file)
// into ming_extract.hpp, which this file includes:
//   model/te/ming_image_te.hpp   IMAGE_*_TOKEN, VISION_* constants, smart_resize, vision_input_size,
//                                preprocess_vision_image, ImageBlock, build_prompt_tokens
//   gk-diffuser.cpp              parse_ming_image_layers
// and core/tensor.hpp (sd::Tensor, sd::ops::interpolate / slice / clamp) is included whole.
// Only the loader step in front of preprocess_vision_image is written out here: the
// uint8 -> float "value / 255.f" of sd_image_to_tensor (core/util.cpp:741-755,
// core/ggml_extend.hpp:188-194), in the engine's [W, H, C, 1] layout.
//
// Input: one JSON object a line on stdin; output: one JSON object a line.
//   {"op": "ids"}                                  -> {"image_start": .., "image_patch": .., "image_end": ..,
//                                                      "factor": .., "pixels": .., "loader_min": .., "loader_max": ..}
//   {"op": "size", "w": W, "h": H}                 -> {"first": [h, w], "final": [h_bar, w_bar]}
//   {"op": "layers", "prompt": "..."}              -> {"layers": N}
//   {"op": "prompt", "text": "...", "n_image": n}  -> {"ids": [...], "encode_calls": [...], "block_start": s}
//   {"op": "preprocess", "in": PATH, "out": PATH, "w": W, "h": H, "c": C}
//        PATH in: W*H*C uint8, row-major HWC (as sd_image_t stores it); out: the float32 result in
//        HWC order -> {"w_bar": .., "h_bar": .., "channels": 3}
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"
#include "json.hpp"

// the engine's log macros (core/util.h) print; nothing here needs them
#define LOG_DEBUG(...) ((void)0)
#define LOG_INFO(...) ((void)0)
#define LOG_WARN(...) ((void)0)
#define LOG_ERROR(...) ((void)0)

#include "ming_extract.hpp"

using json = nlohmann::json;

// A tokenizer for build_prompt_tokens: one id per UTF-8 byte, and every string it is handed
// recorded, so the fixture shows which pieces the engine tokenizes separately.
struct RecordingTokenizer {
    std::vector<std::string> calls;
    std::vector<int> encode(const std::string& text) {
        calls.push_back(text);
        std::vector<int> ids;
        for (unsigned char c : text) {
            ids.push_back(static_cast<int>(c));
        }
        return ids;
    }
};

static json run_preprocess(const json& req) {
    const int64_t w = req.at("w"), h = req.at("h"), c = req.at("c");
    std::ifstream in(req.at("in").get<std::string>(), std::ios::binary);
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (static_cast<int64_t>(bytes.size()) != w * h * c) {
        return {{"error", "input size mismatch"}};
    }
    sd::Tensor<float> image = sd::zeros<float>({w, h, c, 1});
    for (int64_t iw = 0; iw < w; ++iw) {
        for (int64_t ih = 0; ih < h; ++ih) {
            for (int64_t ic = 0; ic < c; ++ic) {
                float value = bytes[static_cast<size_t>(ih * w * c + iw * c + ic)];
                value /= 255.f;
                image.index(iw, ih, ic, 0) = value;
            }
        }
    }
    sd::Tensor<float> out = MingImageTE::preprocess_vision_image(image);
    const int64_t ow = out.shape()[0], oh = out.shape()[1], oc = out.shape()[2];
    std::vector<float> hwc(static_cast<size_t>(ow * oh * oc));
    for (int64_t iw = 0; iw < ow; ++iw) {
        for (int64_t ih = 0; ih < oh; ++ih) {
            for (int64_t ic = 0; ic < oc; ++ic) {
                hwc[static_cast<size_t>((ih * ow + iw) * oc + ic)] = out.index(iw, ih, ic, 0);
            }
        }
    }
    std::ofstream o(req.at("out").get<std::string>(), std::ios::binary);
    o.write(reinterpret_cast<const char*>(hwc.data()), static_cast<std::streamsize>(hwc.size() * sizeof(float)));
    return {{"w_bar", ow}, {"h_bar", oh}, {"channels", oc}};
}

static json answer(const json& req) {
    const std::string op = req.at("op");
    if (op == "ids") {
        return {{"image_start", MingImageTE::IMAGE_START_TOKEN}, {"image_patch", MingImageTE::IMAGE_PATCH_TOKEN},
                {"image_end", MingImageTE::IMAGE_END_TOKEN}, {"factor", MingImageTE::VISION_FACTOR},
                {"pixels", MingImageTE::VISION_PIXELS}, {"loader_min", MingImageTE::VISION_LOADER_MIN_PIXELS},
                {"loader_max", MingImageTE::VISION_LOADER_MAX_PIXELS}};
    }
    if (op == "size") {
        const int w = req.at("w"), h = req.at("h");
        auto first = MingImageTE::smart_resize(h, w, MingImageTE::VISION_FACTOR, MingImageTE::VISION_LOADER_MIN_PIXELS,
                                               MingImageTE::VISION_LOADER_MAX_PIXELS);
        auto final_size = MingImageTE::vision_input_size(h, w);
        return {{"first", {first.first, first.second}}, {"final", {final_size.first, final_size.second}}};
    }
    if (op == "layers") {
        return {{"layers", parse_ming_image_layers(req.at("prompt").get<std::string>())}};
    }
    if (op == "prompt") {
        RecordingTokenizer tok;
        MingImageTE::ImageBlock block;
        const int64_t n_image = req.at("n_image");
        auto ids = MingImageTE::build_prompt_tokens(tok, req.at("text").get<std::string>(), n_image, 1, n_image,
                                                    n_image > 0 ? &block : nullptr);
        return {{"ids", ids}, {"encode_calls", tok.calls}, {"block_start", block.start}};
    }
    if (op == "preprocess") {
        return run_preprocess(req);
    }
    return {{"error", "unknown op " + op}};
}

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) {
            continue;
        }
        json out;
        try {
            out = answer(json::parse(line));
        } catch (const std::exception& e) {
            out = {{"error", e.what()}};
        }
        std::cout << out.dump(-1, ' ', false, json::error_handler_t::strict) << "\n";
    }
    return 0;
}
